"""Default paths as plain constants: what the command line needs before it knows which command runs.

Nothing here imports anything: ``agent/cli.py`` reads these to build its parser, so ``gpuguard snapshot`` does not
load the settings models (pydantic), the collectors or the logger just to print a default in ``--help``.
"""

DEFAULT_CONFIG_PATH = "/etc/gpuguard/agent.toml"
DEFAULT_HUB_CONFIG_PATH = "/etc/gpuguard/hub.toml"
DEFAULT_STATE_DIR = "/var/lib/gpuguard"
