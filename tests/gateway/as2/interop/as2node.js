// libas2 (npm, not written here) as the AS2 partner of the gateway's tests.
//
//   node --security-revert=CVE-2023-46809 as2node.js compose     < JSON  -> {headers, body(base64)}
//   node --security-revert=CVE-2023-46809 as2node.js verify-mdn  < JSON  -> {disposition, mic, algorithm, ...}
//   node --security-revert=CVE-2023-46809 as2node.js serve FILE.json  -> prints {"port": N}, then receives
//
// --security-revert=CVE-2023-46809: Node 20 refuses RSA PKCS #1 v1.5 decryption (the Marvin attack) unless
// started with it; AS2 key transport is PKCS #1 v1.5 in most deployments (and in the gateway's sender), so the
// test partner is started with it. Nothing else runs in this process.
'use strict'
const http = require('http')
const { AS2Composer, AS2Parser, AS2Disposition } = require('libas2')

function readStdin () {
  return new Promise((resolve) => {
    const chunks = []
    process.stdin.on('data', (c) => chunks.push(c))
    process.stdin.on('end', () => resolve(JSON.parse(Buffer.concat(chunks).toString('utf8'))))
  })
}

function agreement (o) {
  // host: libas2's side (the test partner); partner: the gateway
  return {
    host: {
      name: 'libas2 partner', id: o.hostId, url: o.hostUrl || 'http://localhost/',
      certificate: o.hostCert, privateKey: o.hostKey,
      decrypt: o.decrypt !== false, sign: o.sign === false ? false : (o.sign || 'sha-256'),
      mdn: o.mdn === false ? undefined : { async: !!o.async, signing: o.mdnSigning === false ? false : 'sha-256' }
    },
    partner: {
      name: 'gateway', id: o.partnerId, url: o.partnerUrl || 'http://localhost/as2', file: 'XML',
      certificate: o.partnerCert,
      encrypt: o.encrypt === false ? false : (o.encrypt || 'aes256-CBC'),
      verify: o.verify !== false,
      mdn: { async: false, signing: o.mdnSigning === false ? false : 'sha-256' }
    }
  }
}

async function compose (o) {
  const composer = new AS2Composer({
    message: { filename: 'order.xml', contentType: 'application/xml', content: Buffer.from(o.payload, 'base64') },
    agreement: agreement(o)
  })
  const request = await composer.toRequestOptions(o.partnerUrl)
  const headers = {}
  for (const [k, v] of Object.entries(request.headers)) headers[k] = String(v)
  if (o.async) headers['Receipt-Delivery-Option'] = o.asyncUrl
  return { headers, body: Buffer.from(request.body).toString('base64') }
}

function mimeOf (headers, body) {
  const head = Object.entries(headers).map(([k, v]) => `${k}: ${v}`).join('\r\n')
  return Buffer.concat([Buffer.from(head + '\r\n\r\n', 'latin1'), body])
}

async function verifyMdn (o) {
  const node = await AS2Parser.parse(mimeOf(o.headers, Buffer.from(o.body, 'base64')))
  const signed = node.contentType && node.contentType.startsWith('multipart/signed')
  const disposition = await AS2Disposition.incoming(node, signed ? { cert: o.cert } : undefined)
  const n = disposition.notification
  return {
    signed,
    originalMessageId: n.originalMessageId,
    processed: n.disposition.processed,
    disposition: n.toString ? undefined : undefined,
    description: n.disposition.description || null,
    mic: n.receivedContentMic ? n.receivedContentMic.mic : null,
    algorithm: n.receivedContentMic ? n.receivedContentMic.algorithm : null
  }
}

async function serve (o) {
  const server = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', async () => {
      try {
        const headers = {}
        for (let i = 0; i < req.rawHeaders.length; i += 2) headers[req.rawHeaders[i]] = req.rawHeaders[i + 1]
        const node = await AS2Parser.parse(mimeOf(headers, Buffer.concat(chunks)))
        const { dispositionNode, contentNode } = await AS2Disposition.outgoing({ node, agreement: agreement(o) })
        if (contentNode && contentNode.content) {
          process.stdout.write(JSON.stringify({ received: Buffer.from(contentNode.content).toString('base64') }) + '\n')
        }
        const { headers: h, body } = await dispositionNode.buildObject()
        const out = {}
        for (const [k, v] of Object.entries(h)) out[k] = String(v)
        const asyncUrl = headers['Receipt-Delivery-Option'] || headers['receipt-delivery-option']
        if (asyncUrl) { // the MDN goes to the sender's URL on its own request
          res.writeHead(200, { 'content-length': '0' })
          res.end()
          const mdnReq = http.request(asyncUrl, { method: 'POST', headers: out })
          mdnReq.on('error', (e) => process.stdout.write(JSON.stringify({ error: String(e) }) + '\n'))
          mdnReq.end(body)
          return
        }
        res.writeHead(200, out)
        res.end(body)
      } catch (error) {
        process.stdout.write(JSON.stringify({ error: String(error && error.stack || error) }) + '\n')
        res.writeHead(500, { 'content-type': 'text/plain' })
        res.end(String(error))
      }
    })
  })
  server.listen(0, '127.0.0.1', () => {
    process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n')
  })
}

async function main () {
  const command = process.argv[2]
  const options = process.argv[3] ? JSON.parse(require('fs').readFileSync(process.argv[3], 'utf8')) : await readStdin()
  if (command === 'serve') return serve(options)
  const result = command === 'compose' ? await compose(options) : await verifyMdn(options)
  process.stdout.write(JSON.stringify(result))
}

main().catch((error) => { process.stderr.write(String(error && error.stack || error)); process.exit(1) })
