/**
 * prom-client's metric classes, each from its own module. Its index also
 * loads the Pushgateway (node:http, https, zlib), the cluster aggregator and,
 * through the default metrics' CPU counter, @opentelemetry/api for exemplars
 * Kanal never records: 90 files more for every start to read and compile
 * (bench/RESULTS.md, "a start close to a Go binary"). The classes are the ones
 * the index exports (index.js requires these same files), so a Registry from
 * either registers the other's metrics.
 */
import CounterClass from 'prom-client/lib/counter.js';
import GaugeClass from 'prom-client/lib/gauge.js';
import HistogramClass from 'prom-client/lib/histogram.js';
import RegistryClass from 'prom-client/lib/registry.js';

export type { CounterConfiguration, GaugeConfiguration, HistogramConfiguration, LabelValues, Metric } from 'prom-client';

export const Counter = CounterClass;
export type Counter<T extends string = string> = CounterClass<T>;
export const Gauge = GaugeClass;
export type Gauge<T extends string = string> = GaugeClass<T>;
export const Histogram = HistogramClass;
export type Histogram<T extends string = string> = HistogramClass<T>;
export const Registry = RegistryClass;
export type Registry = RegistryClass;
