// Preloaded into the node process that runs Azurite (`node --require`) by
// scripts/azurite.sh when BLOBDRIVE_AZURITE_SWEEP_MINUTES is set.
//
// Azurite sweeps the data of deleted and overwritten blobs every ten minutes
// of its life, and its sweep lists every extent it holds without letting a
// request in: minutes for the tens of thousands of extents a test suite or a
// benchmark writes, during which every request waits and the tests that time
// a request fail. Azurite has no option for the interval; its sweeper reads
// the interval from its constants module when the server starts, so setting
// the constant before the server is built moves the next sweep (the first
// one, on an empty store at start, still runs).
"use strict";

const path = require("path");

const minutes = Number(process.env.BLOBDRIVE_AZURITE_SWEEP_MINUTES);
if (!(minutes > 0)) {
  throw new Error(
    `BLOBDRIVE_AZURITE_SWEEP_MINUTES must be a positive number of minutes, not '${process.env.BLOBDRIVE_AZURITE_SWEEP_MINUTES}'`
  );
}
// process.argv[1] is Azurite's blob entry point, dist/src/blob/main.js: the
// constants module is the one it loads, resolved the same way.
const constants = require(path.join(path.dirname(process.argv[1]), "utils", "constants.js"));
if (typeof constants.DEFAULT_GC_INTERVAL_MS !== "number") {
  throw new Error("this Azurite has no DEFAULT_GC_INTERVAL_MS to set; update scripts/azurite-sweep.js");
}
constants.DEFAULT_GC_INTERVAL_MS = minutes * 60 * 1000;
