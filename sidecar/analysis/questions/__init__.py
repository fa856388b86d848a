"""One module per question the summary answers (sidecar.analysis.summary asks them all).

    kernels       GPU activity of one process: kernel totals, busy time per device and stream, memcpy / memset
    gaps          idle gaps on the GPU and what caused each; ``find_process_syncs``
    syncs         host-side synchronisation: where the CPU waited for the GPU, and what it cost
    steps         per ``ProfilerStep#n``: wall time, and the GPU work, launches, copies and syncs it issued
    anatomy       step anatomy: time per phase per engine step and process, time between forwards
    launches      kernel launch calls on the host: how many, and their CPU time
    cpu           CPU operators by self time
    collectives   NCCL / RCCL kernels, and how much of them overlaps computation
    ranks         ranks side by side: step times, the slowest per step, waits in collectives, the straggler
    modules       time per ``nn.Module`` from torch.profiler's module ranges (``with_modules``)
    modules_text  the summary's ``modules`` as text for ``sidecar analyze``
    intervals     unions, intersections and gaps of time intervals (numpy)
"""
