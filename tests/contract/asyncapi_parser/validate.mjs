// Parse every AsyncAPI document named on the command line with the real @asyncapi/parser.
// Prints one JSON object per file: {file, valid, diagnostics:[{severity, code, message, path}]}
// (a JSON array in all). Exits 1 if any diagnostic has error severity or a file did not parse.
// Severity numbers follow Spectral: 0 error, 1 warning, 2 information, 3 hint.
import { Parser, fromFile } from '@asyncapi/parser';

const SEVERITY = ['error', 'warning', 'information', 'hint'];

async function check(parser, file) {
  const { document, diagnostics } = await fromFile(parser, file).parse();
  const shown = diagnostics.map((d) => ({
    severity: SEVERITY[d.severity] ?? String(d.severity),
    code: String(d.code),
    message: d.message,
    path: (d.path || []).join('.'),
  }));
  const errors = shown.filter((d) => d.severity === 'error');
  return { file, valid: document !== undefined && errors.length === 0, diagnostics: shown };
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: node validate.mjs FILE...');
  process.exit(2);
}
const parser = new Parser();
const results = [];
for (const file of files) {
  try {
    results.push(await check(parser, file));
  } catch (err) {
    results.push({ file, valid: false, diagnostics: [{ severity: 'error', code: 'exception', message: String(err), path: '' }] });
  }
}
console.log(JSON.stringify(results, null, 2));
process.exit(results.every((r) => r.valid) ? 0 : 1);
