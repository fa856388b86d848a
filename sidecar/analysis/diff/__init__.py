"""``sidecar diff``: two summaries compared (docs/analysis.md, "Comparing two captures").

    changes  ``diff_summaries``: two summaries in, what changed from A to B out
    spread   how much a capture's figures vary from step to step: the noise band
    text     the diff as text for a terminal, the changes beyond noise first
    pair     ``analyse_pair``: two traces' summaries, read at once where the host has a core to spare
"""
