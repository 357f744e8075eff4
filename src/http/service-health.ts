// healthCheckNodePort servers, answering exactly as kube-proxy's
// (pkg/proxy/healthcheck/service_health.go): one HTTP server per service
// with a healthCheckNodePort (LoadBalancer, externalTrafficPolicy Local),
// any path and method, JSON naming the service and its local endpoints,
// 200 only with a ready local endpoint and a healthy agent, else 503. Cloud
// load balancers probe it to send traffic only to nodes with endpoints.
//
// The agent hands over the wanted set after every sync (sync()): servers
// of services that went away or changed port close, new ones open. A port
// that cannot be bound (taken) is reported by service and retried at the
// next sync, as kube-proxy does, and never stops the others.
import http from 'node:http';
import { closeServer, listen } from './http.js';

export interface ServiceHealthTarget {
  readonly namespace: string;
  readonly name: string;
  readonly port: number;
  /** Distinct IPs of this node's ready (not terminating) endpoints of the service, across its ports. */
  readonly localEndpoints: number;
}

export interface ServiceHealthProblem {
  readonly service: string;
  readonly port: number;
  readonly reason: string;
}

interface Serving {
  target: ServiceHealthTarget;
  readonly servers: http.Server[];
}

/** kube-proxy's body: its Go template after dedent, tab-indented, no trailing newline. */
export function healthBody(t: Pick<ServiceHealthTarget, 'namespace' | 'name' | 'localEndpoints'>, healthy: boolean): string {
  return `{\n\t"service": {\n\t\t"namespace": ${JSON.stringify(t.namespace)},\n\t\t"name": ${JSON.stringify(t.name)}\n\t},\n\t"localEndpoints": ${t.localEndpoints},\n\t"serviceProxyHealthy": ${healthy}\n}`;
}

export class ServiceHealthServers {
  private readonly serving = new Map<string, Serving>();

  /**
   * healthy: the agent's own /healthz verdict (kube-proxy's serviceProxyHealthy).
   * hosts: the addresses to listen on ('::' dual-stack by default; one server
   * per node address with --nodeport-addresses).
   */
  constructor(private readonly opts: { healthy: () => boolean; hosts?: readonly string[] }) {}

  /** The services now served, by "namespace/name". */
  ports(): Map<string, number> {
    return new Map([...this.serving].map(([k, s]) => [k, s.target.port]));
  }

  /** Opens, updates and closes servers to match `targets`; resolves with the services whose port could not be bound. */
  async sync(targets: readonly ServiceHealthTarget[]): Promise<ServiceHealthProblem[]> {
    const wanted = new Map(targets.map((t) => [`${t.namespace}/${t.name}`, t]));
    const closing: Array<Promise<void>> = [];
    for (const [key, s] of this.serving) {
      const t = wanted.get(key);
      if (!t || t.port !== s.target.port) {
        this.serving.delete(key);
        closing.push(...s.servers.map((srv) => closeServer(srv)));
      } else {
        s.target = t; // a new endpoint count: answered from the next request on
      }
    }
    await Promise.all(closing);
    const problems: ServiceHealthProblem[] = [];
    for (const [key, t] of wanted) {
      if (this.serving.has(key)) continue;
      const serving: Serving = { target: t, servers: [] };
      try {
        for (const host of this.opts.hosts ?? ['::']) {
          const server = http.createServer((_req, res) => this.answer(serving.target, res));
          serving.servers.push(server);
          await listen(server, t.port, host);
        }
        this.serving.set(key, serving);
      } catch (err) {
        await Promise.all(serving.servers.map((srv) => closeServer(srv)));
        problems.push({ service: key, port: t.port, reason: (err as NodeJS.ErrnoException).code ?? (err as Error).message });
      }
    }
    return problems;
  }

  async close(): Promise<void> {
    const all = [...this.serving.values()].flatMap((s) => s.servers);
    this.serving.clear();
    await Promise.all(all.map((srv) => closeServer(srv)));
  }

  private answer(t: ServiceHealthTarget, res: http.ServerResponse): void {
    const healthy = this.opts.healthy();
    res.writeHead(t.localEndpoints !== 0 && healthy ? 200 : 503, {
      'Content-Type': 'application/json',
      'X-Content-Type-Options': 'nosniff',
      'X-Load-Balancing-Endpoint-Weight': String(t.localEndpoints),
    });
    res.end(healthBody(t, healthy));
  }
}
