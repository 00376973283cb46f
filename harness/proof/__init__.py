"""The scorecard (`tenancy-audit scorecard`): how well the audit's detectors see seeded canaries, and how well they
ignore decoys of the same shape, through every channel the audit reads and every encoding the engine decodes.

`encodings.py` (the encodings, as chains of steps), `cases.py` (the seeded registry, the positives and decoys),
`channels.py` (where each case is put and which findings count), `traffic.py` (the flow channels through a live
mitmdump with the addon), `folder.py` (the evidence folder's files and its reconciliation), `score.py` (the
figures), `scorecard.py` (one run of all of it)."""
