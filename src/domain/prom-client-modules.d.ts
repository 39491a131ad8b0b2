/**
 * Types of the prom-client modules src/domain/prom-client.ts and
 * default-metrics.ts import one by one: prom-client types only its index,
 * whose classes these modules are (prom-client's index.js).
 */
declare module 'prom-client/lib/counter.js' {
  import { Counter } from 'prom-client';
  export default Counter;
}
declare module 'prom-client/lib/gauge.js' {
  import { Gauge } from 'prom-client';
  export default Gauge;
}
declare module 'prom-client/lib/histogram.js' {
  import { Histogram } from 'prom-client';
  export default Histogram;
}
declare module 'prom-client/lib/registry.js' {
  import { Registry } from 'prom-client';
  export default Registry;
}
/** Each default metric: registers its collector on the registry (prom-client's lib/defaultMetrics.js calls them so). */
declare module 'prom-client/lib/metrics/*.js' {
  import type { DefaultMetricsCollectorConfiguration, Registry } from 'prom-client';
  const register: (registry: Registry, config: DefaultMetricsCollectorConfiguration<'text/plain; version=0.0.4; charset=utf-8'>) => void;
  export default register;
}
