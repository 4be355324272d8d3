"""Media plumbing shared by the engines: input paths, streaming decode, intervals."""
