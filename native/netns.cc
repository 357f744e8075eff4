#include "netns.h"

#include <sched.h>

#include <cerrno>
#include <thread>

namespace lbn {

NetnsResult runInNetns(int nsFd, const std::function<int()>& fn) {
  NetnsResult r;
  if (nsFd < 0) {
    r.value = fn();
    return r;
  }
  std::thread t([&] {
    if (::setns(nsFd, CLONE_NEWNET) != 0) {
      r.setnsErr = errno != 0 ? errno : EINVAL;
      return;
    }
    r.value = fn();
  });
  t.join();
  return r;
}

}  // namespace lbn
