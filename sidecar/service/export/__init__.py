"""A finished capture made into what users download, off every engine process.

    merge            ``finalize_capture`` (on a low-priority thread): each process's outcome, the merged trace, the summary
    raw_files        which reported raw files are the capture's own; samples files read; raw files removed
    raw_trace        one process's raw trace, checked once before it is compressed and merged, and its clock
    compression      each process's raw trace gzipped into a file of its own, its sampled stacks' slices first
    kineto_file      a Kineto file copied with events inserted first, in bounded memory
    merged_trace     every process in one gzip trace on one timeline
    merged_analysis  the merged trace's summary, built one process at a time
    process_stems    each process's file stem, unique within a capture across hosts
    safe_files       a capture folder's names, and a file opened so that it is surely the one in that folder
    disk_space       the free-space floor before arming; "no space left on device"; no partial file left
"""
