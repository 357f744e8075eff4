// The part of js-yaml 4.3's API that lbctl uses (@types/js-yaml 4.0.9
// predates maxDepth, maxTotalMergeKeys and the exported `types`).
declare module 'js-yaml' {
  export class Type {
    readonly tag: string;
  }
  export class Schema {
    extend(types: Type | Type[] | { implicit?: Type[]; explicit?: Type[] }): Schema;
  }
  export interface LoadOptions {
    filename?: string;
    schema?: Schema;
    json?: boolean;
    /** Nesting depth of collections (default 100). */
    maxDepth?: number;
    /** Keys copied by merges (`<<`) in one load (default 10000). */
    maxTotalMergeKeys?: number;
    /** Called as each node is opened and closed. */
    listener?: (event: 'open' | 'close', state: unknown) => void;
  }
  export interface Mark {
    readonly line: number;
    readonly column: number;
  }
  export class YAMLException extends Error {
    readonly reason: string;
    readonly mark?: Mark;
  }
  export const CORE_SCHEMA: Schema;
  export const types: { readonly merge: Type };
  export function load(text: string, options?: LoadOptions): unknown;
  const jsyaml: {
    CORE_SCHEMA: Schema;
    types: { readonly merge: Type };
    YAMLException: typeof YAMLException;
    load: typeof load;
  };
  export default jsyaml;
}
