import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { FakeClock } from '../runtime/clock.js';
import { TtlCache } from '../runtime/ttl-cache.js';
import { generateKey, hashKey } from './format.js';
import type { KeyRecord } from './record.js';
import type { KeyRepository, SecretLookup } from './repository.js';
import { KeyVerifier } from './verifier.js';

/** A lookup the test answers when it chooses (a database reply in flight). */
function deferred<T>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

const record = (revokedAt: Date | null): KeyRecord => ({
  id: 'key-1',
  projectId: 'p',
  projectExternalId: 'proj_p',
  projectSlug: 'p',
  name: 'k',
  prefix: 'swy_p_',
  scopes: ['inference'],
  expiresAt: null,
  allowedIps: [],
  blockedIps: [],
  quotaRequests: 0,
  quotaWindow: 60,
  endpointId: null,
  revokedAt,
  rotatedAt: null,
  lastUsedAt: null,
  createdAt: new Date(0),
});

type Found = (SecretLookup & { hash: string }) | null;

/** A verifier whose every database lookup waits until the test answers it. */
function verifierWithPendingLookups() {
  const { value } = generateKey('p');
  const lookups: Array<ReturnType<typeof deferred<Found>>> = [];
  const repo = {
    findBySecretHash: () => {
      const d = deferred<Found>();
      lookups.push(d);
      return d.promise;
    },
  } as unknown as KeyRepository;
  const v = new KeyVerifier(repo, new FakeClock(), { cacheSize: 10, ttlMs: 600_000 });
  return { v, auth: `Bearer ${value}`, hash: hashKey(value), lookups };
}

describe('invalidation racing a lookup in flight', () => {
  it('a revocation that arrives while the key is being looked up is not undone', async () => {
    const { v, auth, hash, lookups } = verifierWithPendingLookups();
    // A request's lookup reads the row before the revocation commits elsewhere...
    const first = v.verify(auth);
    // ...the revocation's invalidation arrives while that reply is on its way...
    v.invalidate('key-1');
    lookups[0]!.resolve({ record: record(null), validUntil: null, hash });
    assert.equal((await first).status, 'ok', 'a request sent before the revocation');
    // ...and the next request reads the row again instead of the stale copy.
    const second = v.verify(auth);
    assert.equal(lookups.length, 2, 'the pre-revocation row was not cached');
    lookups[1]!.resolve({ record: record(new Date(1)), validUntil: null, hash });
    assert.equal((await second).status, 'revoked');
  });

  it('a request after the invalidation does not join the lookup that started before it', async () => {
    const { v, auth, hash, lookups } = verifierWithPendingLookups();
    const before = v.verify(auth);
    v.invalidate('key-1');
    const after = v.verify(auth);
    assert.equal(lookups.length, 2);
    lookups[0]!.resolve({ record: record(null), validUntil: null, hash });
    lookups[1]!.resolve({ record: record(new Date(1)), validUntil: null, hash });
    assert.equal((await before).status, 'ok');
    assert.equal((await after).status, 'revoked');
  });

  it('TtlCache: a load in flight when its entry is deleted is neither joined nor cached', async () => {
    const cache = new TtlCache<string>(new FakeClock(), 600_000, 10);
    const loads: Array<ReturnType<typeof deferred<string>>> = [];
    const load = () => {
      const d = deferred<string>();
      loads.push(d);
      return d.promise;
    };
    const first = cache.get('endpoint', load);
    cache.delete('endpoint'); // suspended elsewhere, invalidated while the read is out
    const second = cache.get('endpoint', load);
    assert.equal(loads.length, 2, 'a new read, not the one from before the invalidation');
    loads[0]!.resolve('active');
    loads[1]!.resolve('suspended');
    assert.equal(await first, 'active');
    assert.equal(await second, 'suspended');
    assert.equal(cache.peek('endpoint'), 'suspended', 'the older read did not overwrite it');
    // The same through clear() (the workers list, all projects' balances).
    const third = cache.get('other', load);
    cache.clear();
    loads[2]!.resolve('stale');
    await third;
    assert.equal(cache.peek('other'), undefined);
  });

  it('TtlCache.expireAll: the next read reloads, and a failed reload serves the old value', async () => {
    const cache = new TtlCache<string>(new FakeClock(), 600_000, 10);
    assert.equal(await cache.get('pool', async () => 'v1'), 'v1');
    cache.expireAll();
    let loads = 0;
    assert.equal(
      await cache.get('pool', async () => {
        loads++;
        return 'v2';
      }),
      'v2',
    );
    assert.equal(loads, 1, 'reloaded at once, not after the TTL');
    cache.expireAll();
    const down = async (): Promise<string> => {
      throw new Error('database unreachable');
    };
    assert.equal(await cache.get('pool', down), 'v2', 'the pool as last read, not nothing');
    cache.clear();
    await assert.rejects(Promise.resolve(cache.get('pool', down)), /unreachable/);
  });
});
