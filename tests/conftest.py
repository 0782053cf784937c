import os

os.environ.setdefault("FMLAB_PROGRESS", "0")
