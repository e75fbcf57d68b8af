"""The demo run of the story: a seeded simulator whose spikes come from the batch plan."""
