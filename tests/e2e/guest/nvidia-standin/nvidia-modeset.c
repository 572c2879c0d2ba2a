// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for NVIDIA's nvidia-modeset.ko (NVKMS) in proxgpu's e2e test host (see nvidia.c):
 * NVIDIA's driver always ships it, nvidia-modprobe -m loads it and makes /dev/nvidia-modeset,
 * and proxgpu gives that node to containers. As NVIDIA/open-gpu-kernel-modules has it
 * (kernel-open/nvidia-modeset/nvidia-modeset-linux.c, nvkms_register_chrdev): the one minor 254
 * of major 195 (NV_MINOR_DEVICE_NUMBER_MODESET_DEVICE, kernel-open/common/inc/
 * nv-chardev-numbers.h) registered as "nvidia-modeset". It needs nvidia loaded first, as the real
 * one does (its symbol makes depmod record the dependency).
 */
#include <linux/cdev.h>
#include <linux/fs.h>
#include <linux/module.h>

#define NV_MAJOR_DEVICE_NUMBER 195
#define NV_MINOR_DEVICE_NUMBER_MODESET_DEVICE 254
#define NVKMS_RDEV MKDEV(NV_MAJOR_DEVICE_NUMBER, NV_MINOR_DEVICE_NUMBER_MODESET_DEVICE)

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("stand-in for NVIDIA's nvidia-modeset.ko in proxgpu's e2e test host");

extern int nv_standin_gpu_count(void);

static struct cdev nvkms_cdev;

static int nvkms_open(struct inode *inode, struct file *file)
{
	return nv_standin_gpu_count() > 0 ? 0 : -ENODEV;
}

static const struct file_operations nvkms_fops = {
	.owner = THIS_MODULE,
	.open = nvkms_open,
};

static int __init nvkms_init(void)
{
	int rc = register_chrdev_region(NVKMS_RDEV, 1, "nvidia-modeset");

	if (rc < 0)
		return rc;
	cdev_init(&nvkms_cdev, &nvkms_fops);
	rc = cdev_add(&nvkms_cdev, NVKMS_RDEV, 1);
	if (rc < 0)
		unregister_chrdev_region(NVKMS_RDEV, 1);
	return rc;
}

static void __exit nvkms_exit(void)
{
	cdev_del(&nvkms_cdev);
	unregister_chrdev_region(NVKMS_RDEV, 1);
}

module_init(nvkms_init);
module_exit(nvkms_exit);
