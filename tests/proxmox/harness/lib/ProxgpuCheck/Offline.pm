package ProxgpuCheck::Offline;

# What a Proxmox VE node has and a test machine lacks, for proxgpu's tests only.
#
# Proxmox's config code `use`s modules that talk to the cluster file system (pmxcfs), Ceph, the
# access-control database or Rust/XS libraries. Reading and checking a config calls none of
# them, but they must load. This module defines those packages in place and marks them loaded
# (%INC), so the copies in the fetched sources (pve-cluster's XS-backed PVE::Cluster, for one)
# are never compiled. Any function not defined here dies with its name: a Proxmox change that
# starts calling one shows up as a failing check, never as a silent fake answer.
#
# Load it before any Proxmox module (pve-check does so in a BEGIN block).

use strict;
use warnings;

# Packages only ever loaded, never called, on the paths pve-check runs.
my @load_only = qw(
    PVE::IPCC
    PVE::AccessControl
    PVE::Firewall::Helpers
    PVE::Network::SDN::Vnets
    PVE::Network::SDN::Zones
    PVE::RADOS
    PVE::APIClient::LWP
    PVE::RS::NVML
    Proxmox::RS::CalendarEvent
);

sub _refuse_all {
    my ($package) = @_;
    no strict 'refs';
    *{"${package}::AUTOLOAD"} = sub {
        my $name = ${"${package}::AUTOLOAD"};
        return if $name =~ /::DESTROY$/;
        die "proxgpu pve-check: $name() needs a Proxmox VE node\n";
    };
    (my $file = "$package.pm") =~ s{::}{/}g;
    $INC{$file} = __FILE__;
}

_refuse_all($_) for @load_only;

# --- PVE::Cluster: the registry of /etc/pve files and their parsers -----------------------------
# Proxmox modules register the parser of each cluster file (mapping/pci.cfg, storage.cfg, ...) at
# load time. Reading one here runs that real parser on the text pve-check was given for it, or
# on undef (the file does not exist) as on a node without it.
{
    package PVE::Cluster;

    use base 'Exporter';
    our @EXPORT_OK = qw(cfs_read_file cfs_write_file cfs_register_file cfs_lock_file);

    my %parser;
    my %text;

    sub cfs_register_file {
        my ($name, $parse) = @_;
        die "cluster file '$name' registered twice\n" if $parser{$name};
        $parser{$name} = $parse;
    }

    # pve-check only: the text /etc/pve/NAME holds for this run.
    sub provide {
        my ($name, $content) = @_;
        $text{$name} = $content;
    }

    sub get_config { return $text{ $_[0] } }

    sub cfs_read_file {
        my ($name) = @_;
        my $parse = $parser{$name} or die "no parser registered for cluster file '$name'\n";
        return $parse->("/etc/pve/$name", $text{$name});
    }

    # The answer of a machine where /etc/pve is not mounted.
    sub check_cfs_is_mounted {
        my ($noerr) = @_;
        return undef if $noerr;
        die "pve configuration filesystem (pmxcfs) not mounted\n";
    }

    sub cfs_write_file { die "proxgpu pve-check: writing /etc/pve/$_[0] needs a Proxmox VE node\n" }
    sub cfs_lock_file { die "proxgpu pve-check: locking /etc/pve/$_[0] needs a Proxmox VE node\n" }
}
ProxgpuCheck::Offline::_refuse_all('PVE::Cluster');

# --- PVE::RPCEnvironment: the API environment ----------------------------------------------------
# A subclass of pve-common's real PVE::RESTEnvironment, as upstream's is, so that questions such
# as is_worker() get the answer of a process that is not an API worker.
require PVE::RESTEnvironment;
{
    package PVE::RPCEnvironment;
    our @ISA = ('PVE::RESTEnvironment');
}
ProxgpuCheck::Offline::_refuse_all('PVE::RPCEnvironment');

1;
