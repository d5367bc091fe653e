"""A content-addressed result cache: a run skips the sweep points whose results cannot have changed.

::

    run = cm.run(doc, loaded=engine, out="runs/sweep", cache="runs/.cache")
    causalab_mini.cache.served(run)     # ['layers=0,pos=-4', ...]: the points not computed

Each point is looked up under a key over everything that decides its results as this run would
use them (``key.py``: the experiment's digest, the point's compiled inputs, the loaded weights'
revision and config, devices and threads, and the run record — engine, versions, source digest,
served dtype, batch size); any part that differs is a miss. A hit gives the point exactly as a
computed run does — every scored metric, the saved tensors, the same files in ``out``, byte for
byte, and the same run.json — without a forward; a miss computes it and stores it
(``store.py``: entries and content-named blobs, each written whole, checked when read).

A served point is like one opened from disk: ``results()``, ``saved()``, ``lookup()``,
``table()``, ``saved_tensors()`` as computed, but no executed plan (``value``, ``prompt``).
``run.plan`` is the plan of the points that were computed (None when all were served).
"""
from .key import FORMAT, CacheError, digest
from .serve import hits, keys, open_store, remember, served
from .store import Entry, Store

__all__ = ["CacheError", "Entry", "FORMAT", "Store", "digest", "hits", "keys", "open_store", "remember", "served"]
