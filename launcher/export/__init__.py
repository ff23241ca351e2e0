"""What the export job shares with the export stage: its settings, decided at planning time."""
