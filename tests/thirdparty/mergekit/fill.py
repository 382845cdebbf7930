"""Runs mergekit's own fill_missing_params on a merge output:

    python tests/thirdparty/mergekit/fill.py BASE_DIR MERGED_DIR OUT_DIR

It calls ``mergekit.scripts.fill_missing_params.copy_and_fill_missing_params`` (the function
that mergekit's merge.py itself calls for architectures with ``post_fill_parameters``) with
its default shard size. The module's own command line (``python -m
mergekit.scripts.fill_missing_params``) cannot be used in mergekit 0.1.5: its ``if __name__ ==
"__main__": main()`` stands above the ``ParameterNamesUtils`` class that ``main`` needs, so it
stops on a NameError (see NOTES.md).
"""

import sys

from mergekit.scripts.fill_missing_params import copy_and_fill_missing_params

if __name__ == "__main__":
    base, merged, out = sys.argv[1:4]
    copy_and_fill_missing_params(base_model_repo_id=base, sub_model_dir=merged, output_dir=out)
