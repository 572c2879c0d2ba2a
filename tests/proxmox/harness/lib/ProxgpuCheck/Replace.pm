package ProxgpuCheck::Replace;

# Replace a function of a loaded module for this process, as Test::MockModule does in Proxmox's
# own tests, and also every copy of it that another package imported: `use PVE::Tools
# qw(run_command)` puts the same code reference into the importing package's symbol table, and
# replacing only the original would leave those copies calling the host.

use strict;
use warnings;

use Scalar::Util ();

# Every glob whose CODE slot holds $code, searched through all loaded packages.
sub _holders {
    my ($code) = @_;
    my @found;
    my @stashes = ('main::');
    my %visited;
    no strict 'refs';
    while (defined(my $stash = shift @stashes)) {
        next if $visited{$stash}++;
        for my $name (keys %{$stash}) {
            my $full = $stash eq 'main::' ? $name : "$stash$name";
            if ($name =~ /::$/) {
                push @stashes, $full;
                next;
            }
            my $glob = ${$stash}{$name};
            next if ref(\$glob) ne 'GLOB';
            my $held = *{$glob}{CODE};
            push @found, $full if $held && $held == $code;
        }
    }
    return @found;
}

# replace('PVE::Tools', get_host_arch => sub { 'x86_64' }): returns the original.
sub replace {
    my ($package, $name, $code) = @_;
    my $original = $package->can($name)
        or die "proxgpu pve-check: ${package}::$name does not exist; Proxmox changed it\n";
    my $prototype = prototype($original);
    Scalar::Util::set_prototype(\&$code, $prototype) if defined($prototype);
    my %targets = map { $_ => 1 } ("${package}::$name", _holders($original));
    no strict 'refs';
    no warnings 'redefine';
    *{$_} = $code for sort keys %targets;
    return $original;
}

1;
