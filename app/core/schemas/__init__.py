"""Request and response bodies (pydantic v2), separate from ORM rows, one module per domain:

* ``common``: what every domain's bodies share (statuses, timestamps, owners, pages, errors);
* ``experiments``: an experiment's spec as the API takes it, and a run as it reads;
* ``datasets``: the built-in datasets and uploads; ``encoders``: a user's own encoders;
* ``inference``: /embed, /predict and /neighbors, their inputs and answers;
* ``indexes``: the indexes /neighbors searches;
* ``sweeps``: a base spec and a grid, their pruning, their progress;
* ``jobs``: batch embedding jobs;
* ``access``: users, tokens, shares, the audit log and /me.
"""
