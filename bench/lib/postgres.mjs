/**
 * A throwaway PostgreSQL database for `npm run bench -- --storage=postgres`.
 * When the server runs on this machine, its processes (the postmaster and the
 * backends it forks, which inherit its CPU affinity) are pinned to the load
 * CPU for the run so the database does not take the router's core, and given
 * back their previous affinity afterwards.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import pg from 'pg';

const LOAD_CPU = 1;

function postgresPids() {
  try {
    return execFileSync('pgrep', ['-x', 'postgres'], { encoding: 'utf8' })
      .split('\n')
      .map((l) => Number(l.trim()))
      .filter((n) => n > 0);
  } catch {
    return [];
  }
}

function affinityOf(pid) {
  const out = execFileSync('taskset', ['-p', String(pid)], { encoding: 'utf8' });
  return out.trim().split(':').pop().trim();
}

function setAffinity(pid, mask) {
  try {
    execFileSync('taskset', ['-p', mask, String(pid)], { stdio: 'ignore' });
    return true;
  } catch {
    return false; // the process exited, or we may not change it
  }
}

export async function createDatabase(adminUrl) {
  const name = `switchyard_bench_${randomBytes(4).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`create database ${name}`);
  await admin.end();
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  const local = ['127.0.0.1', 'localhost', '::1', '[::1]'].includes(url.hostname);
  const saved = local ? postgresPids().map((pid) => [pid, affinityOf(pid)]) : [];
  const pinned =
    saved.length > 0 && saved.every(([pid]) => setAffinity(pid, String(1 << LOAD_CPU)));
  return {
    url: url.toString(),
    pinned,
    async drop() {
      for (const [pid, mask] of saved) setAffinity(pid, mask);
      const c = new pg.Client({ connectionString: adminUrl });
      await c.connect();
      await c.query(`drop database if exists ${name} with (force)`);
      await c.end();
    },
  };
}
