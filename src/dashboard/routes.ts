/**
 * The dashboard's routes (role `dashboard`): pages (GET, HTML) and the JSON
 * requests their forms send (POST/DELETE, answered `{next}`, `{reveal}` or the
 * error envelope).
 *
 * Cookies, all `Secure; HttpOnly; SameSite=Lax; Path=/`:
 * - `swy_session`: the session (sessions.ts), up to 1440 minutes;
 * - `swy_login`: a login waiting for its second factor, 5 minutes;
 * - `swy_csrf`: the CSRF token of pages shown before any session (sign-in);
 * - `swy_idp`: the OAuth `state` of an identity-provider sign-in this browser
 *   began (10 minutes): the callback must come back to the same browser, so a
 *   sign-in or a link started elsewhere cannot be completed here (login CSRF).
 *
 * Bodies are JSON only: the three types a cross-site form can send (urlencoded,
 * multipart, text/plain) get 415, before the CSRF check even runs.
 *
 * CSRF (spec): every page embeds its token in `<meta name="csrf-token">`; every
 * POST, PUT, PATCH or DELETE here must send it as X-CSRF-Token, compared in
 * constant time with the session's (the pending login's, or `swy_csrf` before
 * either). A cross-site page can neither read the meta tag nor set the header.
 *
 * Acting on a project (keys, webhooks, approvals) goes through the router's
 * internal path with a fresh internal proxy token for the user's role in that
 * project (internal-token.ts): in-process when this instance serves the API,
 * else over HTTP to SWITCHYARD_ROUTER_URL.
 */
import fastifyCookie from '@fastify/cookie';
import type { FastifyInstance, FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import { ServiceError } from '../errors/index.js';
import { errorHandler, toServiceError } from '../http/errors.js';
import { mayDecide } from '../exec/approvals.js';
import type { Role } from '../exec/users.js';
import { request as httpRequest } from '../runtime/http-client.js';
import type { Services } from '../runtime/services.js';
import type { Dashboard } from './index.js';
import { scopesOf } from './internal-token.js';
import { IdpError } from './oidc.js';
import { form, html, input, page, SCRIPT, STYLE, type Markup } from './pages.js';
import { LOGIN_CHALLENGE_MS, newToken, sameToken, SESSION_MAX_MS } from './sessions.js';

/** Largest body of the sign-in forms (bytes). */
const SIGN_IN_BODY_BYTES = 16 * 1024;

const SESSION = 'swy_session';
const LOGIN = 'swy_login';
const CSRF = 'swy_csrf';
const IDP = 'swy_idp';
const IDP_LOGIN_MS = 10 * 60_000;
const COOKIE = { path: '/', httpOnly: true, secure: true, sameSite: 'lax' as const };

const SECURITY_HEADERS = {
  'Content-Security-Policy':
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
  'X-Frame-Options': 'DENY',
  'Referrer-Policy': 'same-origin',
  'X-Content-Type-Options': 'nosniff',
  'Cache-Control': 'no-store',
};

declare module 'fastify' {
  interface FastifyRequest {
    dash?: { userId: string; csrfToken: string };
  }
}

interface Forwarded {
  status: number;
  body: Record<string, unknown>;
}

export function dashboardRoutes(s: Services, d: Dashboard): FastifyPluginAsync {
  return async (app: FastifyInstance) => {
    await app.register(fastifyCookie);
    app.removeContentTypeParser('text/plain');
    app.addHook('onSend', async (_request, reply) => {
      reply.headers(SECURITY_HEADERS);
    });

    // A page a browser asked for (GET, Accept: text/html) that fails is answered
    // with a page, not the API's JSON envelope; fetch() calls keep the envelope.
    app.setErrorHandler((err, request, reply) => {
      const wantsPage =
        request.method === 'GET' && /text\/html/.test(String(request.headers.accept ?? ''));
      if (!wantsPage) return errorHandler(err, request, reply);
      const se = toServiceError(err);
      if (se.status >= 500) request.log.error({ err, code: se.code }, 'request failed');
      const csrf = request.cookies[CSRF] ?? '';
      return reply
        .code(se.status)
        .type('text/html; charset=utf-8')
        .send(
          page({
            title: 'Error',
            csrf,
            body: html`<section>
              <h1>${se.status === 404 ? 'Not found' : 'Something went wrong'}</h1>
              <p class="error">${se.message}</p>
              <p><a href="/dashboard">Back to your projects</a></p>
            </section>`,
          }),
        );
    });

    const sessionOf = async (r: FastifyRequest) => {
      const active = await d.sessions.resolve(r.cookies[SESSION]);
      return active ? { userId: active.userId, csrfToken: active.csrfToken } : null;
    };

    /** JSON requests of a signed-in user: the session, then the CSRF header. */
    const signedIn = async (r: FastifyRequest) => {
      const sess = await sessionOf(r);
      if (!sess) {
        throw new ServiceError('authentication_required', { message: 'Sign in again.' });
      }
      checkCsrf(r, sess.csrfToken);
      r.dash = sess;
    };

    const pageUser = async (r: FastifyRequest, reply: FastifyReply) => {
      const sess = await sessionOf(r);
      if (!sess) {
        void reply.redirect('/login');
        return null;
      }
      const account = await d.accounts.view(sess.userId);
      if (!account) {
        void reply.redirect('/login');
        return null;
      }
      return { sess, account };
    };

    /** A session, unless `stillValid` (sessions.ts) says no: false then, and no cookie. */
    const openSession = async (
      reply: FastifyReply,
      userId: string,
      stillValid?: () => Promise<boolean>,
    ) => {
      const opened = await d.sessions.open(userId, stillValid);
      if (!opened) return false;
      void reply.setCookie(SESSION, opened.token, { ...COOKIE, maxAge: SESSION_MAX_MS / 1000 });
      void reply.clearCookie(LOGIN, COOKIE);
      return true;
    };

    /**
     * After the first factor: a session, or the 5-minute second-factor step. With
     * `password`, the hash the password was checked against: a change or reset
     * meanwhile (which ends every session) refuses the sign-in, 401.
     */
    const afterFirstFactor = async (
      reply: FastifyReply,
      user: { id: string; totpSecret: string | null },
      password?: string,
    ) => {
      const stillValid =
        password === undefined
          ? undefined
          : async () => (await d.accounts.user(user.id))?.passwordHash === password;
      const refused = () =>
        new ServiceError('invalid_credentials', {
          message: 'The password has just been changed; sign in with the new one.',
        });
      if (user.totpSecret) {
        const challenge = await d.sessions.openChallenge(user.id, stillValid);
        if (!challenge) throw refused();
        void reply.setCookie(LOGIN, challenge.token, {
          ...COOKIE,
          maxAge: LOGIN_CHALLENGE_MS / 1000,
        });
        return '/login/2fa';
      }
      if (!(await openSession(reply, user.id, stillValid))) throw refused();
      return '/dashboard';
    };

    /** The router's internal path, for the user's role in the project. */
    const forward = async (
      r: FastifyRequest,
      project: { externalId: string; role: Role },
      method: 'GET' | 'POST' | 'DELETE',
      path: string,
      body?: unknown,
    ): Promise<Forwarded> => {
      const user = await d.accounts.user(r.dash!.userId);
      if (!user) throw new ServiceError('authentication_required');
      const token = await d.tokens.mint({
        user: user.externalId,
        project: project.externalId,
        role: project.role,
        scopes: scopesOf(project.role),
      });
      const url = `/internal/v1/projects/${project.externalId}${path}`;
      const headers: Record<string, string> = { authorization: `Bearer ${token}` };
      const payload = body === undefined ? undefined : JSON.stringify(body);
      if (payload) headers['content-type'] = 'application/json';
      if (!s.config.routerUrl) {
        const res = await app.inject({ method, url, headers, ...(payload ? { payload } : {}) });
        return { status: res.statusCode, body: parseJson(res.body) };
      }
      const res = await httpRequest(`${s.config.routerUrl}${url}`, {
        method,
        headers,
        ...(payload ? { body: payload } : {}),
      });
      return { status: res.statusCode, body: parseJson(await res.body.text()) };
    };

    const membership = async (userId: string, projectRef: string) => {
      const p = await s.projects.findByExternalId(projectRef);
      if (!p) throw new ServiceError('project_not_found');
      const m = (await s.exec.users.memberships(userId)).find((x) => x.projectId === p.id);
      if (!m) throw new ServiceError('project_not_found');
      return { project: p, role: m.role, externalId: p.externalId };
    };

    /** The router's answer, or its error passed on as it is. */
    /** `where?error=…&sig=…`: an error message for the next page to show (`notice`). */
    const noticeUrl = (where: string, message: string) =>
      `${where}?error=${encodeURIComponent(message)}&sig=${d.noticeSig(message)}`;
    /** The error a page shows: the router's own message, or a generic one for any other text. */
    const notice = (r: FastifyRequest): string | null => {
      const q = r.query as { error?: unknown; sig?: unknown };
      if (typeof q.error !== 'string' || q.error === '') return null;
      return typeof q.sig === 'string' && sameToken(q.sig, d.noticeSig(q.error))
        ? q.error
        : 'The sign-in did not complete; try again.';
    };

    const ok = (f: Forwarded, reply: FastifyReply) => {
      if (f.status >= 400) {
        // The router's envelope as it is: message, type, code, param (spec, Errors).
        const e = (f.body.error ?? {}) as Record<string, unknown>;
        return reply.code(f.status).send({
          error: {
            message: e.message ?? 'The request failed.',
            type: e.type ?? 'api_error',
            code: e.code ?? 'internal_error',
            param: e.param ?? null,
          },
        });
      }
      return null;
    };

    // ---- static assets ----
    app.get('/dashboard/app.js', async (_r, reply) =>
      reply.type('text/javascript; charset=utf-8').send(SCRIPT),
    );
    app.get('/dashboard/app.css', async (_r, reply) =>
      reply.type('text/css; charset=utf-8').send(STYLE),
    );

    // ---- sign-in ----
    app.get('/login', async (r, reply) => {
      if (await sessionOf(r)) return reply.redirect('/dashboard');
      const csrf = r.cookies[CSRF] ?? newToken();
      void reply.setCookie(CSRF, csrf, COOKIE);
      const q = r.query as { expired?: string };
      const error = notice(r);
      const providers = d.idps.map((p) => p.name);
      return reply.type('text/html; charset=utf-8').send(
        page({
          title: 'Sign in',
          csrf,
          body: html`<section>
              ${
                q.expired
                  ? html`<p class="error">The login took longer than 5 minutes; sign in again.</p>`
                  : null
              }
              ${error ? html`<p class="error">${error}</p>` : null}
              ${form({
                action: '/login',
                id: 'login',
                fields: html`${input('email', 'E-mail', 'email', { autocomplete: 'username' })}
                ${input('password', 'Password', 'password', { autocomplete: 'current-password' })}`,
                submit: 'Sign in',
              })}
            </section>
            ${
              providers.length
                ? html`<section>
                    ${providers.map((n) => html`<p><a class="idp" href="/auth/${n}">Sign in with ${n}</a></p>`)}
                  </section>`
                : null
            }`,
        }),
      );
    });

    // Anyone may post these before signing in: a body is an e-mail and a password or
    // a code, never the megabytes the API's limit allows.
    const signIn = { bodyLimit: SIGN_IN_BODY_BYTES };
    app.post('/login', signIn, async (r, reply) => {
      const csrf = r.cookies[CSRF];
      if (!csrf) throw new ServiceError('csrf_token_invalid');
      checkCsrf(r, csrf);
      const b = fields(r.body, ['email', 'password']);
      const user = await d.accounts.passwordLogin(b.email, b.password);
      return { next: await afterFirstFactor(reply, user, user.passwordHash ?? '') };
    });

    app.get('/login/2fa', async (r, reply) => {
      const c = await d.sessions.challenge(r.cookies[LOGIN]);
      if (!c) return reply.redirect('/login?expired=1');
      return reply.type('text/html; charset=utf-8').send(
        page({
          title: 'Two-factor authentication',
          csrf: c.csrfToken,
          body: html`<section>
            <p>Enter the 6-digit code from your authenticator app, or one of your backup codes.</p>
            ${form({
              action: '/login/2fa',
              id: 'code',
              fields: input('code', 'Code', 'text', { autocomplete: 'one-time-code' }),
              submit: 'Verify',
            })}
          </section>`,
        }),
      );
    });

    app.post('/login/2fa', signIn, async (r, reply) => {
      const token = r.cookies[LOGIN];
      const c = await d.sessions.challenge(token);
      if (!c || !token) throw new ServiceError('login_expired');
      checkCsrf(r, c.csrfToken);
      const b = fields(r.body, ['code']);
      await d.accounts.checkCode(c.userId, b.code);
      // The challenge is taken after the session is written: ended meanwhile (a
      // password change or reset), it takes the new session with it.
      if (!(await openSession(reply, c.userId, () => d.sessions.takeChallenge(token)))) {
        throw new ServiceError('login_expired');
      }
      return { next: '/dashboard' };
    });

    app.post('/logout', async (r, reply) => {
      // A live session ends only with the page's token: without it (a cross-site form,
      // which brings no session cookie under SameSite=Lax) nothing happens. A session
      // already over (ended by a password change or reset, or expired) has nothing to
      // protect: its cookie is cleared and the page goes to sign-in, whatever token
      // the stale page carried.
      const sess = await sessionOf(r);
      if (sess) {
        checkCsrf(r, sess.csrfToken);
        await d.sessions.close(r.cookies[SESSION]);
      }
      void reply.clearCookie(SESSION, COOKIE);
      return { next: '/login' };
    });

    // ---- identity providers ----
    /**
     * Callbacks go to the configured public URL. Without one, in development only,
     * to the origin the request came to; production refuses (a callback address
     * taken from the Host header is the client's to choose).
     */
    const base = (r: FastifyRequest) => {
      if (s.config.publicBaseUrl) return s.config.publicBaseUrl;
      if (s.config.env === 'production') {
        throw new IdpError(
          'not_configured',
          'Identity-provider sign-in needs SWITCHYARD_BASE_URL in production.',
        );
      }
      return `${r.protocol}://${r.host}`;
    };

    // Sign-in only. Linking an identity to a signed-in account starts with a POST
    // carrying the page's CSRF token (/account/identities/<idp>/link): a GET any
    // site can make a signed-in browser follow, so as a link it would attach the
    // identity the provider's session happens to hold (an attacker's) to the
    // victim's account. A signed-in browser is sent to its account page instead.
    app.get<{ Params: { idp: string } }>('/auth/:idp', async (r, reply) => {
      if (await sessionOf(r)) return reply.redirect('/account');
      try {
        const { url, pending } = await d.providers(base(r)).begin(r.params.idp);
        await d.idpLogins.save(pending, null, IDP_LOGIN_MS);
        void reply.setCookie(IDP, pending.state, { ...COOKIE, maxAge: IDP_LOGIN_MS / 1000 });
        return reply.redirect(url);
      } catch (err) {
        return reply.redirect(noticeUrl('/login', idpMessage(err)));
      }
    });

    app.get<{ Params: { idp: string } }>('/auth/:idp/callback', async (r, reply) => {
      const state = (r.query as { state?: string }).state;
      const mine = r.cookies[IDP];
      void reply.clearCookie(IDP, COOKIE);
      // Only the browser that began this sign-in may complete it.
      const pending =
        state && mine && sameToken(state, mine)
          ? await d.idpLogins.take(state, r.params.idp)
          : null;
      let linking = false;
      try {
        if (!pending) throw new IdpError('login_refused', 'The sign-in expired; start again.');
        if (pending.linkUserId) {
          linking = true;
          // A link completes in the session that asked for it, and no other.
          const sess = await sessionOf(r);
          if (sess?.userId !== pending.linkUserId) {
            throw new IdpError('login_refused', 'Sign in again, then link the identity.');
          }
        }
        const callback = new URL(r.url, base(r));
        const identity = await d.providers(base(r)).complete(r.params.idp, callback, pending.login);
        const user = await d.accounts.signInWith(identity, pending.linkUserId);
        if (linking) return reply.redirect('/account');
        return reply.redirect(await afterFirstFactor(reply, user));
      } catch (err) {
        const message = err instanceof ServiceError ? err.message : idpMessage(err);
        const where = linking ? '/account' : '/login';
        return reply.redirect(noticeUrl(where, message));
      }
    });

    // ---- projects ----
    app.get('/dashboard', async (r, reply) => {
      const u = await pageUser(r, reply);
      if (!u) return reply;
      const memberships = await s.exec.users.memberships(u.sess.userId);
      const projects = await Promise.all(
        memberships.map(async (m) => ({ p: await s.projects.getById(m.projectId), role: m.role })),
      );
      return reply.type('text/html; charset=utf-8').send(
        page({
          title: 'Projects',
          csrf: u.sess.csrfToken,
          user: u.account,
          body: html`<section>
            ${
              projects.length === 0
                ? html`<p class="muted">You are not a member of any project yet.</p>`
                : html`<table>
                    <tr>
                      <th>Project</th>
                      <th>Id</th>
                      <th>Your role</th>
                    </tr>
                    ${projects
                      .filter((x) => x.p)
                      .map(
                        (x) =>
                          html`<tr>
                            <td>
                              <a href="/dashboard/projects/${x.p!.externalId}">${x.p!.name}</a>
                            </td>
                            <td><code>${x.p!.externalId}</code></td>
                            <td>${x.role}</td>
                          </tr>`,
                      )}
                  </table>`
            }
          </section>`,
        }),
      );
    });

    app.get<{ Params: { projectId: string } }>(
      '/dashboard/projects/:projectId',
      async (r, reply) => {
        const u = await pageUser(r, reply);
        if (!u) return reply;
        r.dash = u.sess;
        const m = await membership(u.sess.userId, r.params.projectId);
        const [keys, webhooks, approvals] = await Promise.all([
          forward(r, m, 'GET', '/keys'),
          forward(r, m, 'GET', '/webhooks?limit=100'),
          forward(r, m, 'GET', `/approvals?status=pending&limit=${APPROVALS_SHOWN}`),
        ]);
        const manage = scopesOf(m.role).includes('management');
        const root = `/dashboard/projects/${m.externalId}`;
        // A section the role may not see is left out quietly; any other failure (the
        // router unreachable or refusing this instance) is said, not shown as empty.
        const failed = [keys, webhooks, approvals].find(
          (f) =>
            f.status >= 400 && (f.body.error as { code?: unknown })?.code !== 'scope_insufficient',
        );
        const failure = failed
          ? String((failed.body.error as { message?: unknown })?.message ?? `HTTP ${failed.status}`)
          : null;
        return reply.type('text/html; charset=utf-8').send(
          page({
            title: m.project.name,
            csrf: u.sess.csrfToken,
            user: u.account,
            body: html`<p class="muted">
                Project <code>${m.externalId}</code>; your role: ${m.role}.
              </p>
              ${
                failure
                  ? html`<p class="error" role="alert">
                      Part of this project could not be loaded: ${failure}
                    </p>`
                  : null
              }
              ${keysSection(root, list(keys), manage)}
              ${webhooksSection(root, list(webhooks), manage)}
              ${approvalsSection(root, approvals, m.role)}`,
          }),
        );
      },
    );

    /** The path's id as one segment of the forwarded path (`../` and `?` stay data). */
    const id = (r: { params: { id?: string } }) => encodeURIComponent(r.params.id ?? '');

    const projectAction = <B>(
      path: string,
      handler: (
        r: FastifyRequest<{ Params: { projectId: string; id?: string }; Body: B }>,
        m: { externalId: string; role: Role },
      ) => Promise<Forwarded>,
      reveal?: (body: Record<string, unknown>) => string[],
    ) =>
      app.post<{ Params: { projectId: string; id?: string }; Body: B }>(
        `/dashboard/projects/:projectId${path}`,
        async (r, reply) => {
          await signedIn(r);
          const m = await membership(r.dash!.userId, r.params.projectId);
          const f = await handler(r, m);
          const failed = ok(f, reply);
          if (failed) return failed;
          return reveal ? { reveal: reveal(f.body) } : { next: null };
        },
      );

    projectAction(
      '/keys',
      (r, m) => {
        const b = (r.body ?? {}) as Record<string, unknown>;
        const scopes = Array.isArray(b.scopes) && b.scopes.length ? b.scopes : undefined;
        return forward(r, m, 'POST', '/keys', {
          ...(typeof b.name === 'string' && b.name ? { name: b.name } : {}),
          ...(scopes ? { scopes } : {}),
        });
      },
      (k) => [`Your new key (shown once): ${String(k.key)}`],
    );
    projectAction(
      '/keys/:id/rotate',
      (r, m) => forward(r, m, 'POST', `/keys/${id(r)}/rotate`, {}),
      (k) => [
        `The key's new value (shown once): ${String(k.key)}`,
        'The old value keeps working for 24 hours.',
      ],
    );
    projectAction('/keys/:id/revoke', (r, m) => forward(r, m, 'DELETE', `/keys/${id(r)}`));
    projectAction(
      '/webhooks',
      (r, m) => {
        const b = (r.body ?? {}) as Record<string, unknown>;
        const events =
          typeof b.events === 'string'
            ? b.events.split(/[\s,]+/).filter(Boolean)
            : (b.events as unknown);
        return forward(r, m, 'POST', '/webhooks', { url: b.url, events });
      },
      (w) => [`Signing secret (shown once): ${String(w.secret)}`],
    );
    projectAction('/webhooks/:id/delete', (r, m) => forward(r, m, 'DELETE', `/webhooks/${id(r)}`));
    projectAction('/approvals/:id/approve', (r, m) =>
      forward(r, m, 'POST', `/approvals/${id(r)}/approve`, {}),
    );
    projectAction('/approvals/:id/reject', (r, m) => {
      const reason = ((r.body ?? {}) as Record<string, unknown>).reason;
      return forward(r, m, 'POST', `/approvals/${id(r)}/reject`, {
        ...(typeof reason === 'string' && reason ? { reason } : {}),
      });
    });

    // Any other page under /dashboard: the dashboard's not-found (a page for a
    // browser, with the dashboard's headers), not the API's JSON 404.
    app.get('/dashboard/*', async (r) => {
      throw new ServiceError('route_not_found', {
        message: `No such page: ${r.url.split('?', 1)[0]}`,
      });
    });

    // ---- account ----
    app.get('/account', async (r, reply) => {
      const u = await pageUser(r, reply);
      if (!u) return reply;
      const a = u.account;
      const error = notice(r);
      return reply.type('text/html; charset=utf-8').send(
        page({
          title: 'Account',
          csrf: u.sess.csrfToken,
          user: a,
          body: html`${error ? html`<p class="error">${error}</p>` : null}
            <section>
              <p>${a.name} · ${a.email} · <code>${a.externalId}</code></p>
            </section>
            <section>
              <h2>Password</h2>
              ${form({
                action: '/account/password',
                id: 'password',
                fields: html`${
                  a.hasPassword
                    ? input('current_password', 'Current password', 'password', {
                        autocomplete: 'current-password',
                      })
                    : null
                }
                ${input('password', 'New password (12 characters or more)', 'password', {
                  autocomplete: 'new-password',
                })}`,
                submit: a.hasPassword ? 'Change password' : 'Set password',
              })}
              <p class="muted">Changing it signs you out everywhere.</p>
            </section>
            <section>
              <h2>Two-factor authentication</h2>
              ${
                a.twoFactor
                  ? html`<p>On. ${a.backupCodesLeft} backup codes left.</p>
                      ${form({
                        action: '/account/backup-codes',
                        id: 'backup-codes',
                        fields: input('code', 'Code from your app'),
                        submit: 'New backup codes',
                      })}
                      ${form({
                        action: '/account/2fa/disable',
                        id: 'disable-2fa',
                        fields: input('code', 'Code from your app'),
                        submit: 'Turn off',
                        danger: true,
                      })}`
                  : html`<p>Off.</p>
                      ${form({ action: '/account/2fa/setup', id: 'setup-2fa', submit: 'Set up' })}
                      ${form({
                        action: '/account/2fa/enable',
                        id: 'enable-2fa',
                        fields: input('code', 'Code from your app, after setting it up'),
                        submit: 'Turn on',
                      })}`
              }
            </section>
            <section>
              <h2>Sign-in with identity providers</h2>
              ${
                a.identities.length
                  ? html`<table>
                      ${a.identities.map(
                        (i) =>
                          html`<tr>
                            <td>${i.provider}</td>
                            <td>${i.email ?? ''}</td>
                            <td>
                              ${form({
                                action: `/account/identities/${i.provider}/unlink`,
                                submit: 'Unlink',
                                danger: true,
                              })}
                            </td>
                          </tr>`,
                      )}
                    </table>`
                  : html`<p class="muted">None linked.</p>`
              }
              ${d.idps.map((p) =>
                form({ action: `/account/identities/${p.name}/link`, submit: `Link ${p.name}` }),
              )}
            </section>`,
        }),
      );
    });

    app.post('/account/password', async (r, reply) => {
      await signedIn(r);
      const b = (r.body ?? {}) as Record<string, unknown>;
      if (typeof b.password !== 'string') {
        throw new ServiceError('invalid_body', {
          message: "Missing required parameter: 'password'.",
          param: 'password',
        });
      }
      const current = typeof b.current_password === 'string' ? b.current_password : undefined;
      const user = await d.accounts.user(r.dash!.userId);
      if (user?.passwordHash && current === undefined) {
        throw new ServiceError('invalid_body', {
          message: "Missing required parameter: 'current_password'.",
          param: 'current_password',
        });
      }
      await d.accounts.setPassword(r.dash!.userId, b.password, current);
      void reply.clearCookie(SESSION, COOKIE);
      return { next: '/login' };
    });
    app.post('/account/2fa/setup', async (r) => {
      await signedIn(r);
      const { secret, uri } = await d.accounts.beginTotp(r.dash!.userId);
      return {
        reveal: [
          'Add this to your authenticator app, then enter a code from it below.',
          `Key: ${secret}`,
          uri,
        ],
      };
    });
    app.post('/account/2fa/enable', async (r) => {
      await signedIn(r);
      const codes = await d.accounts.enableTotp(r.dash!.userId, fields(r.body, ['code']).code);
      return { reveal: ['Two-factor authentication is on. Backup codes (shown once):', ...codes] };
    });
    app.post('/account/2fa/disable', async (r) => {
      await signedIn(r);
      await d.accounts.disableTotp(r.dash!.userId, fields(r.body, ['code']).code);
      return { next: '/account' };
    });
    app.post('/account/backup-codes', async (r) => {
      await signedIn(r);
      const codes = await d.accounts.regenerateBackupCodes(
        r.dash!.userId,
        fields(r.body, ['code']).code,
      );
      return { reveal: ['New backup codes (shown once; the old ones no longer work):', ...codes] };
    });
    app.post<{ Params: { provider: string } }>(
      '/account/identities/:provider/unlink',
      async (r) => {
        await signedIn(r);
        await d.accounts.unlink(r.dash!.userId, r.params.provider);
        return { next: '/account' };
      },
    );

    // Begins linking an identity to the signed-in account (CSRF-checked like every
    // POST); the page's script follows `next` to the provider.
    app.post<{ Params: { provider: string } }>(
      '/account/identities/:provider/link',
      async (r, reply) => {
        await signedIn(r);
        let begun;
        try {
          begun = await d.providers(base(r)).begin(r.params.provider);
        } catch (err) {
          throw new ServiceError('identity_login_failed', { message: idpMessage(err) });
        }
        await d.idpLogins.save(begun.pending, r.dash!.userId, IDP_LOGIN_MS);
        void reply.setCookie(IDP, begun.pending.state, { ...COOKIE, maxAge: IDP_LOGIN_MS / 1000 });
        return { next: begun.url };
      },
    );
  };
}

function checkCsrf(r: FastifyRequest, expected: string): void {
  const sent = r.headers['x-csrf-token'];
  if (!sameToken(typeof sent === 'string' ? sent : undefined, expected)) {
    throw new ServiceError('csrf_token_invalid');
  }
}

/** Required string fields of a form body; 400 naming the first one missing. */
function fields<K extends string>(body: unknown, names: K[]): Record<K, string> {
  const b = (body ?? {}) as Record<string, unknown>;
  const out = {} as Record<K, string>;
  for (const n of names) {
    if (typeof b[n] !== 'string' || b[n] === '') {
      throw new ServiceError('invalid_body', {
        message: `Missing required parameter: '${n}'.`,
        param: n,
      });
    }
    out[n] = b[n];
  }
  return out;
}

function parseJson(text: string): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(text);
    return typeof v === 'object' && v !== null ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

function list(f: Forwarded): Array<Record<string, unknown>> {
  const data = f.body.data;
  return f.status < 400 && Array.isArray(data) ? (data as Array<Record<string, unknown>>) : [];
}

function idpMessage(err: unknown): string {
  if (err instanceof IdpError) {
    if (err.code === 'unknown_provider') return 'No such identity provider.';
    if (err.code === 'provider_unreachable') return 'The identity provider cannot be reached.';
    // The operator's part (no public base URL in production), not the provider's.
    if (err.code === 'not_configured')
      return 'Sign-in with an identity provider is not set up here.';
    return 'The identity provider did not sign you in.';
  }
  return 'The identity provider did not sign you in.';
}

function keysSection(root: string, keys: Array<Record<string, unknown>>, manage: boolean): Markup {
  return html`<section id="keys">
    <h2>API keys</h2>
    <table>
      <tr>
        <th>Name</th>
        <th>Prefix</th>
        <th>Scopes</th>
        <th>Status</th>
        <th></th>
      </tr>
      ${keys.map(
        (k) =>
          html`<tr>
            <td>${String(k.name ?? '')}</td>
            <td><code>${String(k.prefix ?? '')}</code></td>
            <td>${Array.isArray(k.scopes) ? k.scopes.join(', ') : ''}</td>
            <td>${String(k.status ?? '')}</td>
            <td>
              ${
                manage && k.status === 'active'
                  ? html`${form({ action: `${root}/keys/${String(k.id)}/rotate`, submit: 'Rotate' })}
                    ${form({ action: `${root}/keys/${String(k.id)}/revoke`, submit: 'Revoke', danger: true })}`
                  : null
              }
            </td>
          </tr>`,
      )}
    </table>
    ${
      manage
        ? form({
            action: `${root}/keys`,
            id: 'new-key',
            fields: html`${input('name', 'Name', 'text', { required: false })}
              <label
                ><input type="checkbox" name="scopes[]" value="inference" checked />
                inference</label
              >
              <label><input type="checkbox" name="scopes[]" value="management" /> management</label>
              <label><input type="checkbox" name="scopes[]" value="execution" /> execution</label>`,
            submit: 'Create key',
          })
        : null
    }
  </section>`;
}

function webhooksSection(
  root: string,
  hooks: Array<Record<string, unknown>>,
  manage: boolean,
): Markup {
  return html`<section id="webhooks">
    <h2>Webhooks</h2>
    <table>
      <tr>
        <th>URL</th>
        <th>Events</th>
        <th></th>
      </tr>
      ${hooks.map(
        (w) =>
          html`<tr>
            <td>${String(w.url ?? '')}</td>
            <td>${Array.isArray(w.events) ? w.events.join(', ') : ''}</td>
            <td>
              ${
                manage
                  ? form({
                      action: `${root}/webhooks/${String(w.id)}/delete`,
                      submit: 'Delete',
                      danger: true,
                    })
                  : null
              }
            </td>
          </tr>`,
      )}
    </table>
    ${
      manage
        ? form({
            action: `${root}/webhooks`,
            id: 'new-webhook',
            fields: html`${input('url', 'URL (https://…)', 'url')}
            ${input('events', 'Event types (comma-separated)', 'text', {
              placeholder: 'exec.completed, exec.failed',
            })}`,
            submit: 'Add webhook',
          })
        : null
    }
  </section>`;
}

/** Pending approvals listed on a project page; the API's page size at most. */
const APPROVALS_SHOWN = 100;

/**
 * The project's pending approvals (the newest 100, as the API lists them), with what
 * a decider needs: the tool, its risk, the stage, who decides it and until when. The
 * buttons are shown only to a role that may decide the current stage.
 */
function approvalsSection(root: string, f: Forwarded, role: Role): Markup {
  const approvals = list(f);
  const more = f.body.has_more === true;
  return html`<section id="approvals">
    <h2>Pending approvals</h2>
    ${
      approvals.length === 0
        ? html`<p class="muted">None.</p>`
        : html`<div class="scroll">
              <table>
                <tr>
                  <th>Tool</th>
                  <th>Risk</th>
                  <th>Invocation</th>
                  <th>Stage</th>
                  <th>Until</th>
                  <th></th>
                </tr>
                ${approvals.map((a) => {
                  const target = String(a.target ?? '');
                  return html`<tr>
                    <td><code>${String(a.tool ?? '')}</code></td>
                    <td>${String(a.risk ?? '')}</td>
                    <td><code>${String(a.invocation_id ?? '')}</code></td>
                    <td>${String(a.stage ?? '')} (${target})</td>
                    <td>${String(a.stage_deadline ?? '')}</td>
                    <td>
                      ${
                        mayDecide(role, target)
                          ? html`${form({
                              action: `${root}/approvals/${String(a.id)}/approve`,
                              submit: 'Approve',
                            })}
                            ${form({
                              action: `${root}/approvals/${String(a.id)}/reject`,
                              fields: input('reason', 'Reason', 'text', { required: false }),
                              submit: 'Reject',
                              danger: true,
                            })}`
                          : html`<span class="muted">decided by ${target}</span>`
                      }
                    </td>
                  </tr>`;
                })}
              </table>
            </div>
            ${
              more
                ? html`<p class="muted">
                    Showing the ${APPROVALS_SHOWN} newest pending approvals; older ones are waiting
                    too (the API lists them all:
                    <code>GET /v1/exec/approvals?status=pending</code>).
                  </p>`
                : null
            }`
    }
  </section>`;
}
