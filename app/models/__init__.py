"""Model pairs: the catalog (models.toml), Hub downloads, pair files, the pair check, the starter pair, hardware fit
and what to load. Imports the engine (GGUF metadata, the compatibility rule), nothing above it."""
