package PVE::pvecfg;

use strict;
use warnings;

sub package {
    return 'pve-manager';
}

sub version {
    return '8.4.1';
}

sub release {
    return '8.4';
}
