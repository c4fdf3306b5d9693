"""python -m loraplex.observability [serve_config.yaml] [--out deploy]: write the alert rules,
their promtool tests and the Grafana dashboard generated from the config."""
import argparse
from pathlib import Path

from loraplex.observability.generated import write_generated
from loraplex.observability.served import load_served


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loraplex.observability", description=__doc__)
    parser.add_argument("config", nargs="?", default="serve_config.yaml", help="Ray Serve config with the LoRAPlex app")
    parser.add_argument("--out", default="deploy", type=Path, help="directory to write under (default: deploy)")
    args = parser.parse_args()
    for path in write_generated(load_served(args.config), args.out):
        print(path)


main()
