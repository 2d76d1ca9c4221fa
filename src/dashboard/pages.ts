/**
 * The dashboard's HTML: server-rendered pages, every interpolated value escaped
 * (`html` tagged template), each page with its `csrf-token` meta tag (spec:
 * CSRF). No inline script: one static script (`SCRIPT`, served as
 * /dashboard/app.js) sends every `<form data-send>` with fetch and the
 * X-CSRF-Token header, shows an error in the form, reveals values shown once
 * (a new key, backup codes) and follows `next`. The Content-Security-Policy
 * (routes.ts) allows scripts and styles from the dashboard itself only.
 */

/** A piece of markup that is already safe (the result of `html`). */
export class Markup {
  constructor(readonly text: string) {}
  toString(): string {
    return this.text;
  }
}

const ESCAPES: Record<string, string> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;',
};

export function escape(value: unknown): string {
  return String(value).replace(/[&<>"']/g, (c) => ESCAPES[c]!);
}

type Part = Markup | string | number | boolean | null | undefined | readonly Part[];

function render(v: Part): string {
  if (v === null || v === undefined || v === false) return '';
  if (v instanceof Markup) return v.text;
  if (Array.isArray(v)) return v.map((x: Part) => render(x)).join('');
  return escape(v);
}

/** Markup with every interpolation escaped (arrays joined, Markup kept as is). */
export function html(strings: TemplateStringsArray, ...values: Part[]): Markup {
  let out = strings[0]!;
  for (let i = 0; i < values.length; i++) out += render(values[i]!) + strings[i + 1]!;
  return new Markup(out);
}

export function page(o: {
  title: string;
  csrf: string;
  body: Markup;
  user?: { name: string } | null;
}): string {
  return html`<!doctype html>
    <html lang="en">
      <head>
        <meta charset="utf-8" />
        <meta name="viewport" content="width=device-width, initial-scale=1" />
        <meta name="csrf-token" content="${o.csrf}" />
        <title>${o.title} · Switchyard</title>
        <link rel="stylesheet" href="/dashboard/app.css" />
        <script src="/dashboard/app.js" defer></script>
      </head>
      <body>
        <header>
          <a class="brand" href="/dashboard">Switchyard</a>
          ${
            o.user
              ? html`<nav>
                  <a href="/dashboard">Projects</a>
                  <a href="/account">Account</a>
                  <form data-send action="/logout" class="inline">
                    <button type="submit">Sign out</button>
                  </form>
                  <span class="who">${o.user.name}</span>
                </nav>`
              : null
          }
        </header>
        <main>
          <h1>${o.title}</h1>
          ${o.body}
        </main>
      </body>
    </html> `.text;
}

/** A form sent by the script; `fields` are its inputs, `reveal` shows values shown once. */
export function form(o: {
  action: string;
  method?: 'POST' | 'DELETE';
  fields?: Markup;
  submit: string;
  id?: string;
  danger?: boolean;
}): Markup {
  return html`<form
    data-send
    action="${o.action}"
    data-method="${o.method ?? 'POST'}"
    ${o.id ? html`id="${o.id}"` : null}
  >
    ${o.fields ?? null}
    <button type="submit" class="${o.danger ? 'danger' : ''}">${o.submit}</button>
    <p class="error" role="alert" hidden></p>
    <pre class="reveal" hidden></pre>
  </form>`;
}

export function input(
  name: string,
  label: string,
  type = 'text',
  extra: { required?: boolean; autocomplete?: string; placeholder?: string } = {},
): Markup {
  return html`<label
    >${label}
    <input
      name="${name}"
      type="${type}"
      ${extra.required === false ? null : html`required`}
      ${extra.autocomplete ? html`autocomplete="${extra.autocomplete}"` : null}
      ${extra.placeholder ? html`placeholder="${extra.placeholder}"` : null}
  /></label>`;
}

export const STYLE = `
body { font: 15px/1.5 system-ui, sans-serif; margin: 0; color: #1d2329; background: #f6f7f9; }
header { display: flex; flex-wrap: wrap; gap: .5rem 1.5rem; align-items: center; padding: .6rem 1.5rem; background: #1d2329; }
header a, header .who { color: #fff; text-decoration: none; }
header nav { display: flex; gap: 1rem; align-items: center; }
.brand { font-weight: 600; }
main { max-width: 60rem; margin: 1.5rem auto; padding: 0 1.5rem; }
section { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; padding: 1rem 1.25rem; margin: 1rem 0; overflow-x: auto; }
table { border-collapse: collapse; width: 100%; }
td, th { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid #eef0f2; vertical-align: top; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; }
form { margin: .5rem 0; }
form.inline { display: inline; margin: 0; }
label { display: block; margin: .4rem 0; }
input { display: block; padding: .35rem .5rem; width: 18rem; max-width: 100%; box-sizing: border-box; }
input[type=checkbox], input[type=radio] { display: inline; width: auto; margin: 0 .4rem 0 0; }
button { padding: .35rem .9rem; cursor: pointer; }
button.danger { color: #a4161a; }
.error { color: #a4161a; }
.reveal { background: #fff8e1; border: 1px solid #f0d98c; padding: .6rem; white-space: pre-wrap; }
.muted { color: #5f6b76; }
`;

export const SCRIPT = `
(() => {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  document.addEventListener('submit', async (event) => {
    const f = event.target;
    if (!f.hasAttribute('data-send')) return;
    event.preventDefault();
    const error = f.querySelector('.error');
    const reveal = f.querySelector('.reveal');
    if (error) error.hidden = true;
    const body = {};
    for (const [k, v] of new FormData(f)) {
      if (k.endsWith('[]')) (body[k.slice(0, -2)] ??= []).push(v);
      else body[k] = v;
    }
    let res;
    try {
      res = await fetch(f.action, {
        method: f.dataset.method || 'POST',
        headers: { 'content-type': 'application/json', 'x-csrf-token': csrf },
        body: JSON.stringify(body),
        credentials: 'same-origin',
      });
    } catch {
      if (error) { error.textContent = 'The dashboard cannot be reached.'; error.hidden = false; }
      return;
    }
    const data = await res.json().catch(() => ({}));
    if (!res.ok) {
      if (error) {
        error.textContent = (data.error && data.error.message) || 'Something went wrong.';
        error.hidden = false;
      }
      return;
    }
    if (data.reveal && reveal) {
      reveal.textContent = data.reveal.join('\\n');
      reveal.hidden = false;
      f.querySelector('button[type="submit"]').disabled = true;
      return;
    }
    if (data.next) location.assign(data.next);
    else location.reload();
  });
})();
`;
