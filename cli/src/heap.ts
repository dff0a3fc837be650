/**
 * V8 heap settings for the long-running services (`up`, `scheduler`, `agent`).
 *
 * Every file byte that crosses the agent link lands in a fresh ArrayBuffer on each side (socket
 * reads, websocket frames), so an 8 MiB transfer allocates 8-16 MiB outside a JavaScript heap of
 * only about 20 MiB. V8 counts those bytes against the heap's next collection limit, which it sets
 * after each full collection from the live size times a factor it adapts to how fast the program
 * allocates. On a two-core machine the factor settled low in about one process in three, and
 * that process then ran a full collection every few transfers: 15-20 ms more CPU per 8 MiB and a
 * third less throughput, for the process's whole life. A fixed factor of 4 keeps the limit
 * well above the transfer churn; the price is a limit of about 100 MiB instead of 30.
 */
import { setFlagsFromString } from 'node:v8';

const HEAP_GROWING_PERCENT = 300;

export function tuneHeapForStreaming(): void {
  // Read at every limit computation, so setting it after start-up takes effect.
  setFlagsFromString(`--heap-growing-percent=${HEAP_GROWING_PERCENT}`);
}
