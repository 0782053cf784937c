"""Each chapter's configs, runners, result dataclasses (``chN_<topic>.py``) and its
figures, tables and sliders (``chN_figures.py``). A chapter module imports the layers
below it and no other chapter."""
