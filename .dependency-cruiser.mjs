// dependency-cruiser's configuration for `npx depcruise src` (graphs,
// reports): the rules `make check-layers` applies, built from
// docs/architecture.md's layering table by scripts/layers.mjs.
import { cruiseOptions } from './scripts/layers.mjs';

const { ruleSet, validate, ...options } = cruiseOptions(import.meta.dirname);
export default { forbidden: ruleSet.forbidden, options };
