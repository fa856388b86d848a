"""Reading a trace in bounded memory, in one process or two.

    stream        the streaming reader: a trace file in, batches of ``RawEvent`` out
    stream_parts  one trace file read as two parts: the head up to a cut, the tail after it
    halves        a large file read by two processes at once: a forked child reads the head, this one the tail
    forked        a function run in a forked child that answers through a pipe (halves, analysis.diff.pair)
    events        what one trace event is to the analyser, and which events it cares about
    collect       only what the analyses need, in compact arrays, kept while events stream past
    nesting       which host event encloses which, per thread, by time nesting
    view          ``ProcessView``: one process's host threads, steps and the GPU work it launched
    processes     one trace split into processes, each GPU activity tied to the host call that issued it
    ownership     the correlation join on numpy columns: which process launched each GPU activity
    arrays        small numpy helpers the analyses share
    errors        ``TraceFormatError``: the one exception for input the analyser cannot read
"""
