"""The addon as an mitmproxy script of an installed tenancy-audit, which has no addons/tenancy.py to pass to `-s`:

    mitmdump -s "$(python -m harness.capture.script)" --set tenancy_registry=registry.yaml ...

(`python -m harness.capture.script` prints this file's path; the python and mitmdump of the same environment.)
"""

from harness.capture.addon import Tenancy

addons = [Tenancy(script=True)]

if __name__ == "__main__":
    print(__file__)
