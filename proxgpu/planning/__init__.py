"""The planner: which GPUs stay on their host driver and which go to vfio-pci.

:func:`plan_split` turns an :class:`~proxgpu.inspection.inventory.Inventory` and a
:class:`SplitPolicy` into a :class:`Plan`, or raises :class:`~proxgpu.errors.PlanRefusedError`
listing every problem together with what to do about it. It reads and writes nothing;
renderers turn the plan into configuration.
:func:`check_gpu_set` tells whether a set of GPUs shares one NUMA node.

>>> from proxgpu.inspection import Gpu, Inventory, PciFunction
>>> def gpu(bus, node):
...     address = f"0000:{bus}:00.0"
...     return Gpu(address=address, vendor_id="10de", device_id="2330", class_code="0x030200",
...                numa_node=node, iommu_group=int(bus, 16), driver="nvidia",
...                functions=[address], function_info=[])
>>> inventory = Inventory(source="pve1", hostname="pve1", iommu_enabled=True,
...                       gpus=[gpu("01", 0), gpu("11", 0), gpu("81", 1)])
>>> plan = plan_split(inventory, SplitPolicy(lxc=200))
>>> [(g.role, g.numa_node, len(g.gpus), g.driver) for g in plan.groups]
[('host', 0, 2, 'nvidia'), ('vfio', 1, 1, 'vfio-pci')]
>>> plan.warnings, plan.notes
([], ['uneven split: 2 GPUs on the host driver, 1 GPU on vfio-pci'])
>>> [(tp.size, tp.device_sets) for tp in plan.tensor_parallel]
[(1, ['0', '1']), (2, ['0,1'])]
"""

from __future__ import annotations

from proxgpu.inspection.inventory import Inventory
from proxgpu.planning.advice import (
    check_gpu_set,
    tensor_parallel,
    userspace_needs,
    warn_about_shape,
)
from proxgpu.planning.checks import (
    check_claims,
    check_iommu_groups,
    check_iommu_on,
    check_mapping,
    check_slots,
    check_vfio_iommu_groups,
    kept_group_container,
)
from proxgpu.planning.context import Context
from proxgpu.planning.memory import check_memory_fit
from proxgpu.planning.mig import mig_drift, plan_mig
from proxgpu.planning.model import (
    MigUse,
    Plan,
    PlanGroup,
    Problem,
    Role,
    TensorParallelAdvice,
    VgpuUse,
)
from proxgpu.planning.packing import build_groups
from proxgpu.planning.passthrough import advise_passthrough, check_fabric, check_hostpci
from proxgpu.planning.placement import GpuPlacement, GpuSetCheck
from proxgpu.planning.policy import SplitPolicy
from proxgpu.planning.requests import (
    ContainerRequest,
    GuestRequest,
    MigSpec,
    VgpuRequest,
    VmRequest,
    parse_lxc_mig_spec,
    parse_lxc_specs,
    parse_vm_spec,
    parse_vm_specs,
)
from proxgpu.planning.roles import assign_roles
from proxgpu.planning.unreadable import warn_unreadable_entries
from proxgpu.planning.userspace import UserSpace
from proxgpu.planning.vgpu import plan_vgpus


def plan_split(inventory: Inventory, policy: SplitPolicy | None = None) -> Plan:
    """Split the inventory's GPUs into a host group and vfio groups as ``policy`` says.

    The result depends only on the arguments, and its lists are in a fixed order: the host group
    first, then one vfio group per VM in ``policy.vms`` order, then GPUs bound to vfio-pci for no
    VM, one group per NUMA node.

    >>> from proxgpu.inspection import Inventory
    >>> plan_split(Inventory(source="pve1", hostname="pve1"))
    Traceback (most recent call last):
    ...
    proxgpu.errors.PlanRefusedError: pve1: plan refused (1 problem)
      - the inventory holds no GPUs: inspection saw no display controller or accelerator
        fix: check that the host sees its GPUs (lspci -nnk shows each device's class and driver)

    :raises PlanRefusedError: listing every problem found.
    """
    ctx = Context(inventory, policy or SplitPolicy())
    ctx.check_gpus_found()
    ctx.raise_problems()
    roles, vgpus = plan_vgpus(ctx, assign_roles(ctx))
    roles, mig = plan_mig(ctx, roles)
    ctx.raise_problems()
    container = kept_group_container(ctx, roles)
    if container is not None:
        # The split is for the container using the kept GPUs; say so, and plan for it.
        shared = ContainerRequest(vmid=container)
        policy = ctx.policy.model_copy(update={"requests": [shared, *ctx.policy.requests]})
        plan = plan_split(inventory, policy)
        inferred = (
            f"CT {container} uses the GPUs that stay on the host driver and no --lxc was "
            f"given: the host group is for CT {container} (name another with --lxc)"
        )
        return plan.model_copy(update={"notes": [inferred, *plan.notes]})
    groups = build_groups(ctx, roles, vgpus, mig)
    check_slots(ctx, roles)
    check_iommu_groups(ctx, roles)
    check_fabric(ctx, roles)
    check_claims(ctx, groups)
    check_vfio_iommu_groups(ctx, groups)
    enable_iommu = check_iommu_on(ctx, groups)
    check_mapping(ctx, groups)
    check_memory_fit(ctx, groups)
    check_hostpci(ctx, groups)
    ctx.raise_problems()
    warn_about_shape(ctx, groups)
    advise_passthrough(ctx, groups)
    warn_unreadable_entries(ctx, groups)
    return Plan(
        groups=groups,
        warnings=ctx.warnings,
        notes=ctx.notes,
        tensor_parallel=tensor_parallel(ctx, groups),
        enable_iommu=enable_iommu,
        userspace=userspace_needs(inventory, groups),
    )


__all__ = [
    "ContainerRequest",
    "GpuPlacement",
    "GpuSetCheck",
    "GuestRequest",
    "MigSpec",
    "MigUse",
    "Plan",
    "PlanGroup",
    "Problem",
    "Role",
    "SplitPolicy",
    "TensorParallelAdvice",
    "UserSpace",
    "VgpuRequest",
    "VgpuUse",
    "VmRequest",
    "check_gpu_set",
    "mig_drift",
    "parse_lxc_mig_spec",
    "parse_lxc_specs",
    "parse_vm_spec",
    "parse_vm_specs",
    "plan_split",
]
