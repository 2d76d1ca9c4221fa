/**
 * The tool bridge's round limit (docs/EXEC.md: at most 8 rounds, the 8th sent with
 * `tool_choice: "none"`) against a worker that ignores `tool_choice`, as Ollama's
 * OpenAI layer does (ollama/ollama#8421, #17921): it calls a tool in every answer.
 * The bridge must stop at round 8 without running the 8th round's calls, in both
 * modes, instead of running tools round after round until the tier deadline.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import OpenAI from 'openai';
import { MAX_ROUNDS } from '../../src/inference/bridge.js';
import type { InferenceFixture } from '../support/inference.js';
import { AutoTransport, bridgeFixture } from './agents.js';
import { listenWorker, onPost } from '../support/fake-worker.js';

/** Answers every request with a call of `fs_read`, whatever `tool_choice` says. */
async function toolHappyWorker() {
  const seen: Array<{ toolChoice: unknown; stream: boolean }> = [];
  let n = 0;
  const server = http.createServer(
    onPost((body, res) => {
      seen.push({ toolChoice: body.tool_choice, stream: body.stream === true });
      n++;
      // A safety valve for the code under test: past 20 rounds, answer, so a bridge
      // without a limit ends (the tier deadline runs on the fake clock).
      const call = {
        id: `call_${n}`,
        type: 'function',
        function: { name: 'fs_read', arguments: '{"path":"/etc/motd"}' },
      };
      const answer = n % 100 > 20;
      const usage = { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 };
      const head = { id: 'chatcmpl-ollama', created: 1743277352, model: 'qwen2.5-coder:7b' };
      if (body.stream !== true) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(
          JSON.stringify({
            ...head,
            object: 'chat.completion',
            choices: [
              {
                index: 0,
                message: answer
                  ? { role: 'assistant', content: 'done' }
                  : { role: 'assistant', content: '', tool_calls: [call] },
                finish_reason: answer ? 'stop' : 'tool_calls',
              },
            ],
            usage,
          }),
        );
        return;
      }
      const chunk = (c: object) =>
        `data: ${JSON.stringify({ ...head, object: 'chat.completion.chunk', ...c })}\n\n`;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(
        chunk({
          choices: [
            {
              index: 0,
              delta: answer
                ? { role: 'assistant', content: 'done' }
                : { role: 'assistant', content: '', tool_calls: [{ index: 0, ...call }] },
              finish_reason: null,
            },
          ],
        }) +
          chunk({
            choices: [{ index: 0, delta: {}, finish_reason: answer ? 'stop' : 'tool_calls' }],
          }) +
          chunk({ choices: [], usage }) +
          'data: [DONE]\n\n',
      );
    }),
  );
  return {
    ...(await listenWorker(server)),
    seen,
    reset: () => {
      seen.length = 0;
      n = 0;
    },
  };
}

describe('tool bridge round limit with a worker that ignores tool_choice', () => {
  let f: InferenceFixture;
  let w: Awaited<ReturnType<typeof toolHappyWorker>>;
  let t: AutoTransport;
  before(async () => {
    w = await toolHappyWorker();
    // The endpoint's worker is this one instead of the sim.
    ({ f, t } = await bridgeFixture({
      workerUrl: w.url,
      workerId: 'ollama-like',
      agent: 'rounds-agent',
      stdout: 'motd',
    }));
  });
  after(async () => {
    await f.close();
    await w.close();
  });

  for (const stream of [false, true]) {
    it(`${stream ? 'streaming' : 'non-streaming'}: round ${MAX_ROUNDS} is the last, its calls are not run`, async () => {
      w.reset();
      const ran = t.dispatched.length;
      let status = 200;
      try {
        const body = {
          model: 'x',
          messages: [{ role: 'user' as const, content: 'Read the motd.' }],
          x_exec: true,
          ...(stream ? { stream: true } : {}),
        };
        const res = await f.client.chat.completions.create(
          body as unknown as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming,
        );
        if (stream) {
          for await (const _ of res as unknown as AsyncIterable<unknown>) void _;
        }
      } catch (err) {
        assert.ok(err instanceof OpenAI.APIError, String(err));
        status = err.status ?? 0;
      }
      assert.equal(w.seen.length, MAX_ROUNDS, 'upstream rounds');
      assert.equal(w.seen.at(-1)!.toolChoice, 'none');
      assert.equal(
        t.dispatched.length - ran,
        MAX_ROUNDS - 1,
        'tools run: one per round before the last',
      );
      assert.equal(status, 502, 'the model never answered');
    });
  }
});
