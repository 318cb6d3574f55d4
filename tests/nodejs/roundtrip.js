// Run by tests/integration/test_grpc_clients.py: the official Node.js client (locked in
// package-lock.json) sends N messages through a Producer and receives and acks them through a
// SimpleConsumer; prints one JSON line with what happened.
// usage: node roundtrip.js ENDPOINTS TOPIC GROUP N [tls]
// With `tls` both clients speak TLS (`sslEnabled`); grpc-js trusts the system CAs or the file named
// by GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (not NODE_EXTRA_CA_CERTS).
'use strict';
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

// The default egg-logger writes under ~/logs and throws on a second client's shutdown.
const quiet = { info() {}, debug() {}, warn() {}, error(...args) { console.error(...args); } };

async function main() {
  const [endpoints, topic, group, nRaw, tls] = process.argv.slice(2);
  const n = Number(nRaw);
  const sslEnabled = tls === 'tls';
  const producer = new Producer({ endpoints, sslEnabled, logger: quiet, topics: [topic] });
  await producer.startup(); // waits for the server's Settings
  const sent = {};
  for (let i = 0; i < n; i++) {
    const receipt = await producer.send({
      topic,
      tag: 'node',
      keys: [`node-key-${i}`],
      properties: new Map([['seq', String(i)]]),
      body: Buffer.from(`node-${i}`),
    });
    sent[receipt.messageId] = i;
  }
  await producer.shutdown();
  const consumer = new SimpleConsumer({
    endpoints,
    sslEnabled,
    logger: quiet,
    consumerGroup: group,
    subscriptions: new Map([[topic, '*']]),
    awaitDuration: 5000,
  });
  await consumer.startup();
  const received = {};
  const deadline = Date.now() + 60000;
  while (Object.keys(received).length < n && Date.now() < deadline) {
    for (const m of await consumer.receive(32, 30000)) {
      received[m.messageId] = {
        body: m.body.toString(),
        tag: m.tag,
        keys: m.keys,
        seq: m.properties.get('seq'),
        attempt: m.deliveryAttempt,
      };
      await consumer.ack(m);
    }
  }
  await consumer.shutdown();
  console.log(JSON.stringify({ sent, received }));
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
