import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import Fastify from 'fastify';
import { lazySchemaCompilers } from './schema-compilers.js';

describe('lazySchemaCompilers', () => {
  it('a route that declares schemas still gets Ajv validation and fast-json-stringify', async () => {
    const app = Fastify({ schemaController: lazySchemaCompilers });
    app.post(
      '/x',
      {
        schema: {
          body: {
            type: 'object',
            required: ['n'],
            properties: { n: { type: 'integer', minimum: 1 } },
          },
          response: {
            200: { type: 'object', properties: { n: { type: 'integer' } } },
          },
        },
      },
      // `secret` is not in the response schema: the serializer must drop it.
      async (request) => ({ n: (request.body as { n: number }).n, secret: 'no' }),
    );
    try {
      const bad = await app.inject({ method: 'POST', url: '/x', payload: { n: 0 } });
      assert.equal(bad.statusCode, 400);
      assert.match(bad.json<{ message: string }>().message, /must be >= 1/);
      const missing = await app.inject({ method: 'POST', url: '/x', payload: {} });
      assert.equal(missing.statusCode, 400);
      const ok = await app.inject({ method: 'POST', url: '/x', payload: { n: 3 } });
      assert.equal(ok.statusCode, 200);
      assert.equal(ok.body, '{"n":3}');
    } finally {
      await app.close();
    }
  });

  it('an app without schemas never loads Ajv or fast-json-stringify', () => {
    // A fresh process: this one may have loaded them for other tests.
    const module = fileURLToPath(new URL('./schema-compilers.ts', import.meta.url));
    const script = `
      import { createRequire } from 'node:module';
      import Fastify from 'fastify';
      const { lazySchemaCompilers } = await import(${JSON.stringify(module)});
      const app = Fastify({ schemaController: lazySchemaCompilers });
      app.post('/y', async () => ({ ok: true }));
      const res = await app.inject({ method: 'POST', url: '/y', payload: {} });
      await app.close();
      const loaded = Object.keys(createRequire(import.meta.url).cache);
      console.log(JSON.stringify({
        status: res.statusCode,
        ajv: loaded.some((f) => f.includes('/node_modules/ajv/')),
        // Fastify's error serializer always loads fast-json-stringify/lib/serializer.js.
        fjs: loaded.some((f) => f.includes('/node_modules/fast-json-stringify/index.js')),
      }));
    `;
    const out = execFileSync(
      process.execPath,
      ['--import', 'tsx', '--input-type=module', '-e', script],
      { cwd: fileURLToPath(new URL('../..', import.meta.url)), encoding: 'utf8' },
    );
    assert.deepEqual(JSON.parse(out.trim().split('\n').at(-1)!), {
      status: 200,
      ajv: false,
      fjs: false,
    });
  });
});
