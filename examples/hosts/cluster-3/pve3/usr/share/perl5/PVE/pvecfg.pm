package PVE::pvecfg;

use strict;
use warnings;

sub package {
    return 'pve-manager';
}

sub version {
    return '8.0.3';
}

sub release {
    return '8.0';
}
