/** Base of every error lbctl raises on purpose; `code` is stable and machine-readable. */
export class LbError extends Error {
  constructor(message: string, readonly code: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }
}
/** Bad configuration or input: names what and where. */
export class ConfigError extends LbError {
  constructor(message: string, options?: ErrorOptions) { super(message, 'ECONFIG', options); }
}
