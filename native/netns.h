// Work inside another network namespace without moving any of Node's
// threads: a short-lived thread joins the namespace (setns CLONE_NEWNET is
// per thread), runs one step and exits, so its namespace dies with it.
// Namespace-scoped objects made there (a socket iterator, a netlink socket)
// keep their namespace and are used from the calling thread afterwards.
#pragma once

#include <functional>

namespace lbn {

struct NetnsResult {
  int setnsErr = 0;  // positive errno when joining the namespace failed (fn did not run)
  int value = 0;     // fn's return value
};

// nsFd < 0: fn runs on the calling thread, in the caller's namespace.
// fn must not throw.
NetnsResult runInNetns(int nsFd, const std::function<int()>& fn);

}  // namespace lbn
