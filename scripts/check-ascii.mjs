// Fails when a file holds a character above U+007F, naming where. The
// agent's bundle must be ASCII: one character above U+00FF anywhere makes V8
// keep the whole source at two bytes a character (Makefile, BUNDLE).
//   node scripts/check-ascii.mjs FILE...
import { readFileSync } from 'node:fs';

let bad = 0;
for (const file of process.argv.slice(2)) {
  const s = readFileSync(file, 'latin1');
  const at = s.search(/[^\x00-\x7f]/);
  if (at < 0) continue;
  bad++;
  console.error(`${file}: a byte above 0x7f at offset ${at}, in ${JSON.stringify(readFileSync(file).subarray(Math.max(0, at - 40), at + 20).toString('utf8'))}`);
}
process.exit(bad ? 1 : 0);
