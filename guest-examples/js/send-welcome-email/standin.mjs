// A stand-in email API for trying send-welcome-email locally: `node standin.mjs [PORT]`
// (default 8025). Answers POST /v1/messages with 202 {"id": "msg_N"}, the same id again for
// a repeated Idempotency-Key (as real email APIs do), and prints each request as a JSON line.
import { createServer } from 'node:http';

const port = Number(process.argv[2] ?? 8025);
const byKey = new Map();
let sent = 0;

createServer((req, res) => {
  let body = '';
  req.on('data', (chunk) => (body += chunk));
  req.on('end', () => {
    console.log(JSON.stringify({ method: req.method, path: req.url, headers: req.headers, body }));
    if (req.method !== 'POST' || req.url !== '/v1/messages') {
      res.writeHead(404).end();
      return;
    }
    const key = req.headers['idempotency-key'];
    const id = (key && byKey.get(key)) ?? `msg_${++sent}`;
    if (key) byKey.set(key, id);
    res.writeHead(202, { 'content-type': 'application/json' }).end(JSON.stringify({ id }));
  });
}).listen(port, '127.0.0.1', () => console.error(`stand-in email API on http://127.0.0.1:${port}`));
