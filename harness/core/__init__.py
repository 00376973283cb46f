"""The base layer: the canary registry, findings, the protocol shared by stubs and detectors, private
files and child processes. Imports nothing from the other layers."""
