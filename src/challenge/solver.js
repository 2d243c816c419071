// tollgate's proof-of-work solver, run in a Web Worker: finds a nonce such that
// SHA-256(challenge ‖ nonce) starts with `bits` zero bits. Uses WebCrypto where
// the page is a secure context, and its own SHA-256 where it is not (plain HTTP).
"use strict";
const K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2]);
const W = new Uint32Array(64);

// SHA-256 of `msg` (bytes); returns the first 32-bit word of the digest,
// all the leading-zero test needs (difficulty is at most 24 bits).
function firstWord(msg) {
  const len = msg.length;
  const blocks = (len + 9 + 63) >> 6;
  const buf = new Uint8Array(blocks * 64);
  buf.set(msg);
  buf[len] = 0x80;
  const bitlen = len * 8;
  const end = blocks * 64;
  buf[end - 4] = bitlen >>> 24; buf[end - 3] = bitlen >>> 16;
  buf[end - 2] = bitlen >>> 8; buf[end - 1] = bitlen;
  let h0 = 0x6a09e667, h1 = 0xbb67ae85, h2 = 0x3c6ef372, h3 = 0xa54ff53a;
  let h4 = 0x510e527f, h5 = 0x9b05688c, h6 = 0x1f83d9ab, h7 = 0x5be0cd19;
  for (let off = 0; off < end; off += 64) {
    for (let i = 0; i < 16; i++) {
      const j = off + i * 4;
      W[i] = (buf[j] << 24) | (buf[j + 1] << 16) | (buf[j + 2] << 8) | buf[j + 3];
    }
    for (let i = 16; i < 64; i++) {
      const a = W[i - 15], b = W[i - 2];
      const s0 = ((a >>> 7) | (a << 25)) ^ ((a >>> 18) | (a << 14)) ^ (a >>> 3);
      const s1 = ((b >>> 17) | (b << 15)) ^ ((b >>> 19) | (b << 13)) ^ (b >>> 10);
      W[i] = (W[i - 16] + s0 + W[i - 7] + s1) | 0;
    }
    let a = h0, b = h1, c = h2, d = h3, e = h4, f = h5, g = h6, h = h7;
    for (let i = 0; i < 64; i++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const ch = (e & f) ^ (~e & g);
      const t1 = (h + S1 + ch + K[i] + W[i]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const maj = (a & b) ^ (a & c) ^ (b & c);
      const t2 = (S0 + maj) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    }
    h0 = (h0 + a) | 0; h1 = (h1 + b) | 0; h2 = (h2 + c) | 0; h3 = (h3 + d) | 0;
    h4 = (h4 + e) | 0; h5 = (h5 + f) | 0; h6 = (h6 + g) | 0; h7 = (h7 + h) | 0;
  }
  return h0 >>> 0;
}

const enc = new TextEncoder();

function zeroBits(word) { return Math.clz32(word); }

async function solveSubtle(c, bits) {
  const BATCH = 256;
  for (let n = 0; ; n += BATCH) {
    const digests = [];
    for (let i = 0; i < BATCH; i++) {
      digests.push(crypto.subtle.digest("SHA-256", enc.encode(c + (n + i))));
    }
    const all = await Promise.all(digests);
    for (let i = 0; i < BATCH; i++) {
      if (zeroBits(new DataView(all[i]).getUint32(0)) >= bits) return n + i;
    }
    if ((n & 4095) === 0) postMessage({ tried: n });
  }
}

function solveJs(c, bits) {
  const prefix = enc.encode(c);
  for (let n = 0; ; n++) {
    const digits = enc.encode(String(n));
    const msg = new Uint8Array(prefix.length + digits.length);
    msg.set(prefix);
    msg.set(digits, prefix.length);
    if (zeroBits(firstWord(msg)) >= bits) return n;
    if ((n & 16383) === 0) postMessage({ tried: n });
  }
}

onmessage = async (e) => {
  const { c, bits } = e.data;
  const subtle = self.isSecureContext && self.crypto && self.crypto.subtle;
  const nonce = subtle ? await solveSubtle(c, bits) : solveJs(c, bits);
  postMessage({ nonce: String(nonce), via: subtle ? "subtle" : "js" });
};
