// Opens an EventSource (Node's `eventsource` package) on a URL and leaves it open, as a
// page that never closes it does; prints how many times it connected, the events it got
// and its final readyState, once it is CLOSED or WAIT_MS have passed.
import { EventSource } from 'eventsource';

const [url, waitMs] = [process.argv[2], Number(process.argv[3] ?? 5000)];
const source = new EventSource(url);
const names = ['message_start', 'ping', 'content_block_start', 'content_block_delta',
  'content_block_stop', 'message_delta', 'message_stop'];
const events = [];
let opens = 0;
source.onopen = () => { opens += 1; };
for (const name of names) source.addEventListener(name, e => events.push({ event: e.type, id: e.lastEventId }));
const started = Date.now();
while (source.readyState !== 2 && Date.now() - started < waitMs) {
  await new Promise(resolve => setTimeout(resolve, 20));
}
console.log(JSON.stringify({ opens, events, readyState: source.readyState }));
source.close();
