// `lbctl cleanup --kube-proxy`: kube-proxy's iptables chains and nftables
// tables (src/host/kube-proxy-cleanup.ts); lbctl's own datapath is untouched.
import { LbError } from '../../base/errors.js';
import { cleanupKubeProxy, formatReport, reportFailed } from '../../host/kube-proxy-cleanup.js';

export function cleanupKubeProxyCommand(): void {
  const report = cleanupKubeProxy();
  process.stdout.write(`${formatReport(report).join('\n')}\n`);
  // Every backend was tried; a failed removal fails the command.
  if (reportFailed(report)) throw new LbError("some of kube-proxy's rules could not be removed (above)", 'EKUBEPROXYCLEANUP');
}
