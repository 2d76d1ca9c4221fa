/**
 * JSON Schema (as OpenAI clients send it) → the subset node-llama-cpp compiles into a
 * GBNF grammar. Grammar-constrained sampling can only promise what the grammar encodes,
 * and node-llama-cpp silently mistranslates some common constructs (`anyOf` and
 * `type: ["object", "null"]` both become "null only"; an unknown `type` too), so every
 * schema passes through here first:
 *
 * - Rewritten to equivalents: `anyOf` → `oneOf` (a grammar picks one branch either way);
 *   a `type` list naming `object`/`array` → `oneOf` of one schema per type; `nullable`
 *   → `oneOf` with null; `definitions` / `#/definitions/X` → `$defs` / `#/$defs/X`; a
 *   single-element `allOf` → merged; `{}` / `true` → any JSON value; an object with no
 *   `properties` and no `additionalProperties` → any object (JSON Schema's default).
 * - Constraints a grammar cannot enforce (`pattern`, `minimum`, `multipleOf`, string
 *   formats other than date/time/date-time, …): dropped when the schema is not strict
 *   (best effort, as OpenAI's non-strict mode), rejected when it is, because a strict
 *   schema promises that every output validates.
 * - Anything else malformed (unknown type, other `$ref` forms, `false`) or that no value
 *   can satisfy (a `$ref` to no definition, a minimum length, item or property count
 *   above its maximum, in strict mode a `required` property not in `properties`):
 *   rejected, where the grammar would otherwise produce output that breaks the schema.
 *
 * Errors carry the JSON pointer of the offending node.
 */
import type { GbnfJsonSchema } from 'node-llama-cpp';

export class SchemaError extends Error {
  constructor(
    readonly pointer: string,
    message: string,
  ) {
    super(`${pointer || '/'}: ${message}`);
    this.name = 'SchemaError';
  }
}

type Node = Record<string, unknown>;

const PRIMITIVE_TYPES = new Set(['string', 'number', 'integer', 'boolean', 'null']);
/** String formats a grammar writes. */
export const GRAMMAR_FORMATS: ReadonlySet<string> = new Set(['date-time', 'time', 'date']);
/** Constraints on values a grammar cannot express. */
export const UNENFORCEABLE: ReadonlySet<string> = new Set([
  'pattern',
  'patternProperties',
  'minimum',
  'maximum',
  'exclusiveMinimum',
  'exclusiveMaximum',
  'multipleOf',
  'not',
  'if',
  'then',
  'else',
  'dependentRequired',
  'dependentSchemas',
  'propertyNames',
  'unevaluatedProperties',
  'unevaluatedItems',
  'contains',
  'minContains',
  'maxContains',
  'uniqueItems',
  'contentEncoding',
  'contentMediaType',
]);

function isNode(v: unknown): v is Node {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const ANY_VALUE: Node = {
  oneOf: [
    { type: ['string', 'number', 'boolean', 'null'] },
    { type: 'object', additionalProperties: true },
    { type: 'array' },
  ],
};

class Converter {
  /** `$defs` names seen, and the references to check against them once all are seen. */
  readonly defined = new Set<string>();
  readonly refs: Array<{ name: string; pointer: string }> = [];

  constructor(private readonly strict: boolean) {}

  convert(schema: unknown, pointer: string): Node {
    if (schema === true) return ANY_VALUE;
    if (!isNode(schema)) throw new SchemaError(pointer, 'a schema must be an object');
    let s: Node = schema;
    if (Array.isArray(s.allOf)) {
      if (s.allOf.length !== 1) {
        throw new SchemaError(`${pointer}/allOf`, 'allOf with several schemas is not supported');
      }
      const { allOf: _allOf, ...rest } = s;
      const inner: unknown = s.allOf[0];
      if (!isNode(inner)) throw new SchemaError(`${pointer}/allOf/0`, 'a schema must be an object');
      s = { ...inner, ...rest };
    }
    if (s.nullable === true) {
      const { nullable: _nullable, ...rest } = s;
      return { oneOf: [this.convert(rest, pointer), { type: 'null' }] };
    }
    for (const key of Object.keys(s)) {
      if (UNENFORCEABLE.has(key) && this.strict) {
        throw new SchemaError(`${pointer}/${key}`, `"${key}" cannot be enforced by a grammar`);
      }
    }

    const out: Node = {};
    if (typeof s.description === 'string') out.description = s.description;
    if (s.$defs !== undefined || s.definitions !== undefined) out.$defs = this.defs(s, pointer);

    if (s.$ref !== undefined) {
      if (typeof s.$ref !== 'string') throw new SchemaError(`${pointer}/$ref`, 'must be a string');
      const m = /^#\/(?:\$defs|definitions)\/([^/]+)$/.exec(s.$ref);
      if (!m) {
        throw new SchemaError(
          `${pointer}/$ref`,
          'only references of the form #/$defs/Name are supported',
        );
      }
      this.refs.push({ name: m[1]!, pointer: `${pointer}/$ref` });
      return { ...out, $ref: `#/$defs/${m[1]}` };
    }
    if ('const' in s) return { ...out, const: this.primitive(s.const, `${pointer}/const`) };
    if (s.enum !== undefined) {
      if (!Array.isArray(s.enum) || s.enum.length === 0) {
        throw new SchemaError(`${pointer}/enum`, 'must be a non-empty array');
      }
      return { ...out, enum: s.enum.map((v, i) => this.primitive(v, `${pointer}/enum/${i}`)) };
    }
    const alternatives = s.oneOf ?? s.anyOf;
    if (alternatives !== undefined) {
      const key = s.oneOf !== undefined ? 'oneOf' : 'anyOf';
      if (!Array.isArray(alternatives) || alternatives.length === 0) {
        throw new SchemaError(`${pointer}/${key}`, 'must be a non-empty array');
      }
      return {
        ...out,
        oneOf: alternatives.map((a, i) => this.convert(a, `${pointer}/${key}/${i}`)),
      };
    }

    const type = s.type;
    if (type === undefined) {
      if (s.properties !== undefined)
        return this.typed({ ...s, type: 'object' }, 'object', out, pointer);
      if (s.items !== undefined) return this.typed({ ...s, type: 'array' }, 'array', out, pointer);
      return { ...ANY_VALUE, ...out };
    }
    const types = Array.isArray(type) ? type : [type];
    if (types.length === 0) throw new SchemaError(`${pointer}/type`, 'must name at least one type');
    for (const t of types) {
      if (typeof t !== 'string' || (!PRIMITIVE_TYPES.has(t) && t !== 'object' && t !== 'array')) {
        throw new SchemaError(`${pointer}/type`, `unknown type ${JSON.stringify(t)}`);
      }
    }
    if (types.length === 1) return this.typed(s, types[0] as string, out, pointer);
    const structured = types.filter((t) => t === 'object' || t === 'array') as string[];
    if (structured.length === 0) return { ...out, type: types };
    const simple = types.filter((t) => PRIMITIVE_TYPES.has(t as string));
    const branches = structured.map((t) => this.typed(s, t, {}, pointer));
    if (simple.length > 0) branches.push({ type: simple });
    return { ...out, oneOf: branches };
  }

  private typed(s: Node, type: string, out: Node, pointer: string): Node {
    switch (type) {
      case 'object':
        return { ...out, ...this.object(s, pointer) };
      case 'array':
        return { ...out, ...this.array(s, pointer) };
      case 'string': {
        const r: Node = { ...out, type: 'string' };
        if (s.format !== undefined) {
          if (typeof s.format === 'string' && GRAMMAR_FORMATS.has(s.format))
            return { ...r, format: s.format };
          if (this.strict) {
            throw new SchemaError(
              `${pointer}/format`,
              `format ${JSON.stringify(s.format)} cannot be enforced by a grammar`,
            );
          }
        }
        return { ...r, ...bounds(s, 'minLength', 'maxLength', pointer) };
      }
      default:
        return { ...out, type };
    }
  }

  private object(s: Node, pointer: string): Node {
    const r: Node = { type: 'object' };
    if (s.properties !== undefined) {
      if (!isNode(s.properties))
        throw new SchemaError(`${pointer}/properties`, 'must be an object');
      const props: Node = {};
      for (const [k, v] of Object.entries(s.properties))
        props[k] = this.convert(v, `${pointer}/properties/${k}`);
      r.properties = props;
    }
    if (s.required !== undefined) {
      if (!Array.isArray(s.required) || !s.required.every((k) => typeof k === 'string')) {
        throw new SchemaError(`${pointer}/required`, 'must be an array of property names');
      }
      r.required = s.required;
      // A grammar writes only declared properties: a required one it does not know of
      // would be missing from every output.
      const declared = isNode(s.properties) ? s.properties : {};
      const unknown = s.required.findIndex((k) => !Object.hasOwn(declared, k as string));
      if (this.strict && unknown >= 0) {
        throw new SchemaError(
          `${pointer}/required/${unknown}`,
          `${JSON.stringify(s.required[unknown])} is required but not in properties`,
        );
      }
    }
    const extra = s.additionalProperties;
    if (extra === undefined) {
      // JSON Schema allows any extra property by default; node-llama-cpp forbids them.
      // With declared properties the stricter reading still yields valid instances.
      if (s.properties === undefined) r.additionalProperties = true;
    } else if (typeof extra === 'boolean') {
      r.additionalProperties = extra;
    } else {
      r.additionalProperties = this.convert(extra, `${pointer}/additionalProperties`);
    }
    return { ...r, ...bounds(s, 'minProperties', 'maxProperties', pointer) };
  }

  private array(s: Node, pointer: string): Node {
    const r: Node = { type: 'array' };
    if (s.items !== undefined && s.items !== true)
      r.items = this.convert(s.items, `${pointer}/items`);
    if (s.prefixItems !== undefined) {
      if (!Array.isArray(s.prefixItems))
        throw new SchemaError(`${pointer}/prefixItems`, 'must be an array');
      r.prefixItems = s.prefixItems.map((p, i) => this.convert(p, `${pointer}/prefixItems/${i}`));
    }
    return { ...r, ...bounds(s, 'minItems', 'maxItems', pointer) };
  }

  private defs(s: Node, pointer: string): Node {
    const out: Node = {};
    for (const key of ['definitions', '$defs'] as const) {
      const d = s[key];
      if (d === undefined) continue;
      if (!isNode(d)) throw new SchemaError(`${pointer}/${key}`, 'must be an object');
      for (const [name, def] of Object.entries(d)) {
        this.defined.add(name);
        out[name] = this.convert(def, `${pointer}/${key}/${name}`);
      }
    }
    return out;
  }

  private primitive(v: unknown, pointer: string): string | number | boolean | null {
    if (v === null || typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean')
      return v;
    throw new SchemaError(pointer, 'only string, number, boolean and null values are supported');
  }
}

/**
 * A `min`/`max` pair of counts (lengths, items, properties) as the grammar takes it:
 * whole numbers from 0, the minimum not above the maximum (no value could satisfy it,
 * and the grammar would write one that breaks the maximum).
 */
function bounds(s: Node, minKey: string, maxKey: string, pointer: string): Node {
  const r: Node = {};
  for (const key of [minKey, maxKey]) {
    const v = s[key];
    if (v === undefined) continue;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) {
      throw new SchemaError(`${pointer}/${key}`, 'must be a whole number from 0');
    }
    r[key] = v;
  }
  if (typeof r[minKey] === 'number' && typeof r[maxKey] === 'number' && r[minKey] > r[maxKey]) {
    throw new SchemaError(`${pointer}/${minKey}`, `is above ${maxKey}: no value can satisfy both`);
  }
  return r;
}

/** Converts a client's JSON Schema; throws `SchemaError` (see the module comment). */
export function toGrammarSchema(schema: unknown, strict: boolean): GbnfJsonSchema {
  const converter = new Converter(strict);
  const out = converter.convert(schema, '');
  // node-llama-cpp reads a reference to no definition as "any value".
  const dangling = converter.refs.find((r) => !converter.defined.has(r.name));
  if (dangling) {
    throw new SchemaError(dangling.pointer, `no definition named ${JSON.stringify(dangling.name)}`);
  }
  // The converter only emits the shapes node-llama-cpp's schema type describes.
  return out as unknown as GbnfJsonSchema;
}
