"""Named events: publishing them and the workflows they start."""
