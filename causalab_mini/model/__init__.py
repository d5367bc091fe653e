"""A model without its weights: where its checkpoint is and what identifies it (``loading``), its
files refused before a loader reads them (``checkpoint``), what the compiler may know of it
(``facts``), and the one recipe that reads it (``recipe``: resolve → config → tokenizer → facts).

The compiler and both engines read a model through here, so it is found, pinned and refused
the same way whichever of them asks; only the engines go on to load its weights.
"""
