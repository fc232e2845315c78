"""The SGLang fork as a patch set: apply, check and revert the repo's ``patches/*.patch`` on the
SGLang installed in the current Python environment (``python -m smetric_router.patches``).

- :mod:`.unified_diff` splits a patch file into one section per touched file;
- :mod:`.target` finds SGLang's site-packages and version without importing SGLang;
- :mod:`.patch_tool` runs the ``patch`` program (dry runs forward and in reverse give each file's
  state: applied, not applied, conflict);
- :mod:`.patchset` loads the patch folder and reports per patch file and per touched file;
- :mod:`.cli` is the command line.
"""
