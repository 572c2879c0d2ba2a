package ProxgpuCheck::StartFacts;

# The host facts qemu-server's config-to-command generation asks for, answered without a host,
# so that PVE::QemuServer::vm_commandline() (what `qm showcmd` and `qm start` run before they
# spawn QEMU) checks a VM config on a test machine.
#
# The answers follow qemu-server's own src/test/run_config2command_tests.pl: only what reads the
# machine (the QEMU binary, /proc, /sys, the PCI bus, running VMs, volume activation) is
# answered here; the command generation and its rules run unchanged. The facts:
#
#   QEMU            version from --qemu-version (default 11.0.0); no binary is run
#   CPU             x86_64 GenuineIntel, 1024 logical CPUs, 46 physical address bits, no AMD SEV
#   node            --node (default localhost): selects a PCI mapping's `map` entry
#   PCI             every address a hostpciN names exists as one function; a mapping is looked
#                   up for real in --pci-mapping, its match against sysfs is not checked; with
#                   --pci-root, a function offers vGPU types as that tree's sysfs says, the way
#                   pve-common's lspci reads it (mdev_supported_types/, or NVIDIA's nvidia/)
#   NUMA, hugepages every host node exists, 2 MiB and 1 GiB pages are supported
#   network         bridges have MTU 1500
#   storage         real PVE::Storage on --storage-cfg; volumes are never activated, have no
#                   snapshots; /dev paths are block devices and never opened
#   firmware        the OVMF images pve-edk2-firmware ships, with their sizes

use strict;
use warnings;

use File::stat ();
use JSON ();
use Socket ();

use ProxgpuCheck::Replace ();

use PVE::Cluster;
use PVE::File;
use PVE::INotify;
use PVE::Mapping::PCI;
use PVE::Network;
use PVE::ProcFSTools;
use PVE::QemuConfig;
use PVE::QemuServer;
use PVE::QemuServer::CPUConfig;
use PVE::QemuServer::Drive;
use PVE::QemuServer::Helpers;
use PVE::QemuServer::Memory;
use PVE::QemuServer::Monitor;
use PVE::QemuServer::OVMF;
use PVE::QemuServer::PCI;
use PVE::Storage;
use PVE::Storage::RBDPlugin;
use PVE::Storage::ZFSPlugin;
use PVE::SysFSTools;
use PVE::Tools;

# A fresh Proxmox VE install's storage.cfg (LVM-thin root), used without --storage-cfg.
my $FRESH_STORAGE = "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup\n\n"
    . "lvmthin: local-lvm\n\tthinpool data\n\tvgname pve\n\tcontent rootdir,images\n";

# Sizes of the OVMF variable stores pve-edk2-firmware ships, by file name.
my @VARS_SIZES = (
    [qr/OVMF(?:32)?_(?:SEV_)?VARS_4M/, 528 * 1024],
    [qr/OVMF_VARS/, 128 * 1024],
    [qr/AAVMF_VARS/, 64 * 1024 * 1024],
    [qr/RISCV_VIRT_VARS/, 32 * 1024 * 1024],
);

sub _qemu_facts {
    my ($state) = @_;
    my $version = sub { $state->{qemu_version} };
    return (
        ['PVE::QemuServer::Helpers', kvm_user_version => $version],
        ['PVE::QemuServer', kvm_version => $version],
        ['PVE::QemuServer', kernel_has_vhost_net => sub { 1 }],
        ['PVE::QemuServer::Helpers', vm_running_locally => sub { undef }],
        ['PVE::QemuServer::Helpers', get_iscsi_initiator_name => sub { 'iqn.1993-08.org.debian:01:proxgpu' }],
        ['PVE::QemuServer::Monitor', mon_cmd => sub {
            my (undef, $command) = @_;
            die "proxgpu pve-check: QMP '$command' asked of a VM that is not running\n"
                if $command ne 'query-version';
            my ($major, $minor, $micro) = $state->{qemu_version} =~ /^(\d+)\.(\d+)(?:\.(\d+))?/;
            return { qemu => { major => $major, minor => $minor, micro => $micro // 0 } };
        }],
    );
}

sub _cpu_facts {
    # PVE::ProcFSTools keeps /proc/cpuinfo in one hash that qemu-server already holds: set the
    # facts in it rather than replacing the reader.
    my $cpuinfo = PVE::ProcFSTools::read_cpuinfo();
    @$cpuinfo{qw(vendor family cpus sockets)} = ('GenuineIntel', 6, 1024, 1);
    my $no_sev = { 'amd-sev' => {
        cbitpos => 0,
        'reduced-phys-bits' => 0,
        map { ($_ => JSON::false) } qw(sev-support sev-support-es sev-support-snp),
    } };
    return (
        ['PVE::Tools', get_host_arch => sub { 'x86_64' }],
        ['PVE::QemuServer::Helpers', get_host_phys_address_bits => sub { 46 }],
        ['PVE::QemuServer::CPUConfig', get_hw_capabilities => sub { $no_sev }],
        ['PVE::QemuServer::Memory', hugepages_chunk_size_supported => sub { 1 }],
        ['PVE::QemuServer::Memory', host_numanode_exists => sub { 1 }],
    );
}

sub _node_facts {
    my ($state) = @_;
    my $loopback = {
        addr => Socket::pack_sockaddr_in(0, Socket::INADDR_LOOPBACK),
        family => Socket::AF_INET,
        protocol => 6,
        socktype => 1,
    };
    return (
        ['PVE::INotify', nodename => sub { $state->{node} }],
        ['PVE::Network', read_bridge_mtu => sub { 1500 }],
        ['PVE::Tools', next_vnc_port => sub { '5900' }],
        ['PVE::Tools', next_spice_port => sub { '61000' }],
        ['PVE::Tools', getaddrinfo_all => sub { ($loopback) }],
    );
}

sub _pci_facts {
    my ($state) = @_;
    my $one_function = sub {
        my ($filter) = @_;
        return [] if !defined($filter) || ref($filter);
        my $id = $filter =~ /^[[:xdigit:]]{4,}:/ ? $filter : "0000:$filter";
        $id .= '.0' if $id !~ /\.[[:xdigit:]]$/;
        my $device = { id => $id };
        my $root = $state->{pci_root};
        if (defined($root)) {
            # The flags pve-common's PVE::SysFSTools::lspci sets from the same directories.
            my $dir = "$root/sys/bus/pci/devices/$id";
            if (-d "$dir/mdev_supported_types") {
                $device->{mdev} = 1;
            } elsif (-d "$dir/nvidia") {
                $device->@{qw(mdev nvidia)} = (1, 1);
            }
        }
        return [$device];
    };
    return (
        ['PVE::SysFSTools', lspci => $one_function],
        ['PVE::SysFSTools', pci_device_info => sub { {} }],
        ['PVE::Mapping::PCI', assert_valid => sub { 1 }],
        ['PVE::QemuServer::PCI', reserve_pci_usage => sub {
            die "proxgpu pve-check: reserve_pci_usage is for a real start\n" }],
        ['PVE::QemuServer', cleanup_pci_devices => sub { return }],
    );
}

sub _storage_facts {
    my $real_stat = \&File::stat::stat;
    my $real_copy = \&PVE::File::file_copy;
    return (
        ['PVE::Storage', activate_volumes => sub { return }],
        ['PVE::Storage', deactivate_volumes => sub { return }],
        ['PVE::Storage', volume_snapshot_info => sub { {} }],
        # A /dev path is a block device (mode 060660); anything else looks like this script.
        ['File::stat', stat => sub {
            my ($path) = @_;
            my $st = $real_stat->($0);
            $st->[2] = 25008 if $path =~ m{^/dev/};
            return $st;
        }],
        ['PVE::QemuServer::Drive', get_cdrom_path => sub { '/dev/cdrom' }],
        # It would open a passed-through disk for a SCSI INQUIRY.
        ['PVE::QemuServer::Drive', path_is_scsi => sub { return }],
        ['PVE::Storage::RBDPlugin', rbd_volume_config_set => sub { return }],
        ['PVE::Storage::ZFSPlugin', zfs_get_lu_name => sub { 'proxgpu-lu' }],
        ['PVE::Storage::ZFSPlugin', zfs_get_lun_number => sub { '0' }],
        # Without an efidisk Proxmox copies the OVMF variables to /run/qemu-server: not here.
        ['PVE::File', file_copy => sub {
            my ($from, $to, @rest) = @_;
            return if $to =~ m{^/run/qemu-server/};
            return $real_copy->($from, $to, @rest);
        }],
        ['PVE::QemuServer::OVMF', file_exists => sub { 1 }],
        ['PVE::QemuServer::OVMF', file_get_size => sub {
            my ($path) = @_;
            for my $known (@VARS_SIZES) {
                return $known->[1] if $path =~ $known->[0];
            }
            die "proxgpu pve-check: no size known for OVMF image '$path'\n";
        }],
    );
}

# Answer the host's questions for this process; returns the state commandline() uses.
sub install {
    my (%options) = @_;
    my $state = {
        qemu_version => $options{qemu_version} // '11.0.0',
        node => $options{node} // 'localhost',
        pci_root => $options{pci_root},
        conf => undef,
    };
    PVE::Cluster::provide('storage.cfg', $options{storage_cfg} // $FRESH_STORAGE);
    {
        my @complaints;
        local $SIG{__WARN__} = sub { push @complaints, $_[0] };
        $state->{storage} = PVE::Storage::config();
        die "proxgpu pve-check: storage.cfg rejected: @complaints" if @complaints;
    }
    # The config under test, instead of /etc/pve/qemu-server/VMID.conf.
    my @facts = (
        _qemu_facts($state), _cpu_facts(), _node_facts($state), _pci_facts($state),
        _storage_facts(),
        ['PVE::QemuConfig', load_config => sub { $state->{conf} }],
    );
    ProxgpuCheck::Replace::replace(@$_) for @facts;
    return $state;
}

# The QEMU command line for a parsed config, or Proxmox's error (die).
sub commandline {
    my ($state, $conf, $vmid) = @_;
    $state->{conf} = $conf;
    PVE::QemuServer::CPUConfig::initialize_cpu_models();
    return PVE::QemuServer::vm_commandline($state->{storage}, $vmid);
}

1;
