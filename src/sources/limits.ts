// What lbctl accepts from its sources, in one place. Input beyond a limit is
// refused with a message naming the limit; what the source yielded before
// stays in force. The limits bound the agent's memory and time for any
// input, however it was built (docs/standalone.md, "Limits", has the
// measured memory); the model's own limits (ports per Service, endpoints
// and ports per EndpointSlice, addresses per endpoint, EndpointSlices per
// Service) are in src/model/k8s.ts and src/model/desired.ts.

/** A manifest file larger than this is refused before it is read (a manifest directory is not a data store). */
export const MAX_FILE_BYTES = 16 * 1024 * 1024;

/** All manifest files of the directory together: files past this, in name order, are refused. */
export const MAX_DIR_BYTES = 256 * 1024 * 1024;

/** Manifest files read from the directory; the rest, in name order, are refused. */
export const MAX_FILES = 10_000;

/**
 * Problems of one file reported one by one (a log line each); the rest of
 * that read are summed up by category in one report each, so a file of
 * 100,000 bad documents costs a few log lines, not 100,000.
 */
export const MAX_PROBLEMS_LISTED_PER_FILE = 20;

/** Objects in one file: its YAML documents, a List's items counted one by one. */
export const MAX_OBJECTS_PER_FILE = 100_000;

/** Nesting of mappings and sequences inside one document. */
export const MAX_DEPTH = 64;

/**
 * Values in one object, counted as if every alias were expanded: the cap on
 * what an alias bomb ("billion laughs") can make a reader walk. A 1,000
 * endpoint EndpointSlice holds about 10,000.
 */
export const MAX_VALUES_PER_OBJECT = 200_000;

/**
 * YAML values (mappings, sequences, scalars) the parser may build for one
 * file. A manifest holds about 45 per object, 8 bytes of YAML each: a
 * 16 MiB file of manifests about 2.1 million. A file of bare scalars
 * (2 bytes each) is stopped here instead of costing seconds and 700 MiB.
 */
export const MAX_VALUES_PER_FILE = 3_000_000;

/** Keys a merge (`<<`) may copy in one document (js-yaml counts them). */
export const MAX_MERGE_KEYS_PER_DOCUMENT = 10_000;

/** Any one string, key or value: the API server's cap on all of an object's annotations together. */
export const MAX_STRING_CHARS = 256 * 1024;

/**
 * One watch event from the API server (a line of JSON). The API server
 * refuses objects over 1.5 MiB (etcd's request limit) by default; a longer
 * line is not a Kubernetes object.
 */
export const MAX_WATCH_EVENT_BYTES = 16 * 1024 * 1024;

/**
 * One item of a list from the API server. Lists are read one item at a
 * time (src/sources/list-stream.ts), not a page at a time: a list at
 * resourceVersion "0" is the whole collection in one answer, whatever
 * limit was asked for. An item is one object, bounded as a watch event is.
 */
export const MAX_LIST_ITEM_BYTES = MAX_WATCH_EVENT_BYTES;
