"""What every job shares, below all rooms: the machine a run is on (`machine`), the results file it writes
(`results`), progress lines (`progress`), strict inputs (`strict`: a missing input fails or is "not judged"), typed
command-line arguments (`cli`), the workers that run jobs (`workers`: local processes or Ray tasks) and what the
install provides (`installed`). Imports nothing from the rooms above it. Docs: docs/machines.md (the machine),
docs/inputs.md (strict inputs)."""
