/**
 * A dashboard visitor for tests: keeps cookies like a browser (the ones the
 * router sets; Secure is not enforced here), reads each page's csrf-token meta
 * tag, and sends the forms' JSON requests with X-CSRF-Token as the page's
 * script does.
 */
import assert from 'node:assert/strict';
import { request } from 'undici';

export interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json: Record<string, unknown>;
  location: string | undefined;
}

export class Visitor {
  readonly cookies = new Map<string, string>();
  /** The csrf-token of the last page read. */
  csrf = '';

  constructor(readonly base: string) {}

  private cookieHeader(): string {
    return [...this.cookies].map(([k, v]) => `${k}=${v}`).join('; ');
  }

  private keep(setCookie: string | string[] | undefined): void {
    for (const line of [setCookie ?? []].flat()) {
      const [pair] = line.split(';');
      const i = pair!.indexOf('=');
      const name = pair!.slice(0, i).trim();
      const value = pair!.slice(i + 1).trim();
      if (value === '' || /max-age=0|expires=thu, 01 jan 1970/i.test(line))
        this.cookies.delete(name);
      else this.cookies.set(name, value);
    }
  }

  async send(
    method: string,
    path: string,
    opts: { body?: unknown; csrf?: string | null; headers?: Record<string, string> } = {},
  ): Promise<Answer> {
    const headers: Record<string, string> = { ...opts.headers };
    if (this.cookies.size) headers.cookie = this.cookieHeader();
    const csrf = opts.csrf === undefined ? this.csrf : opts.csrf;
    if (csrf !== null && method !== 'GET') headers['x-csrf-token'] = csrf;
    let body: string | undefined;
    if (opts.body !== undefined) {
      body = JSON.stringify(opts.body);
      headers['content-type'] = 'application/json';
    }
    const res = await request(`${this.base}${path}`, { method: method as 'GET', headers, body });
    const text = await res.body.text();
    this.keep(res.headers['set-cookie']);
    let json: Record<string, unknown> = {};
    try {
      json = JSON.parse(text) as Record<string, unknown>;
    } catch {
      json = {};
    }
    const location = res.headers.location;
    return {
      status: res.statusCode,
      headers: res.headers,
      text,
      json,
      location: Array.isArray(location) ? location[0] : location,
    };
  }

  /** GETs a page and takes its csrf-token. */
  async page(path: string): Promise<Answer> {
    const a = await this.send('GET', path);
    const m = /<meta name="csrf-token" content="([^"]*)"/.exec(a.text);
    if (m) this.csrf = m[1]!;
    return a;
  }

  /** Signs in with a password through the login page; returns where it leads. */
  async login(email: string, password: string): Promise<string> {
    const p = await this.page('/login');
    assert.equal(p.status, 200, p.text);
    const r = await this.send('POST', '/login', { body: { email, password } });
    assert.equal(r.status, 200, r.text);
    return String(r.json.next);
  }
}

export function errorCode(a: Answer): unknown {
  return (a.json.error as Record<string, unknown> | undefined)?.code;
}
