from launcher.status.cli import run

run()
