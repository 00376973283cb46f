"""The detection core shared by the live addon and the offline reconciler: the matcher, body decoding,
flow inspection, file and tree scanning, env snapshots and reconciliation. Imports only `harness.core`."""
