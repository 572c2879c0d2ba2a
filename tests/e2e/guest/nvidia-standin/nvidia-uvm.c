// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for NVIDIA's nvidia-uvm.ko in proxgpu's e2e test host (see nvidia.c): a char
 * device region with a dynamic major registered as "nvidia-uvm", minor 0 for /dev/nvidia-uvm and
 * 1 for /dev/nvidia-uvm-tools, as NVIDIA/open-gpu-kernel-modules has it (kernel-open/nvidia-uvm/
 * uvm.c: alloc_chrdev_region with NVIDIA_UVM_DEVICE_NAME "nvidia-uvm"). It needs nvidia loaded
 * first, as the real one does (its symbol makes depmod record the dependency).
 */
#include <linux/cdev.h>
#include <linux/fs.h>
#include <linux/module.h>

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("stand-in for NVIDIA's nvidia-uvm.ko in proxgpu's e2e test host");

extern int nv_standin_gpu_count(void);

static dev_t uvm_base;
static struct cdev uvm_cdev;

static int uvm_open(struct inode *inode, struct file *file)
{
	return nv_standin_gpu_count() > 0 ? 0 : -ENODEV;
}

static const struct file_operations uvm_fops = {
	.owner = THIS_MODULE,
	.open = uvm_open,
};

static int __init uvm_init(void)
{
	int rc = alloc_chrdev_region(&uvm_base, 0, 2, "nvidia-uvm");

	if (rc < 0)
		return rc;
	cdev_init(&uvm_cdev, &uvm_fops);
	rc = cdev_add(&uvm_cdev, uvm_base, 2);
	if (rc < 0)
		unregister_chrdev_region(uvm_base, 2);
	return rc;
}

static void __exit uvm_exit(void)
{
	cdev_del(&uvm_cdev);
	unregister_chrdev_region(uvm_base, 2);
}

module_init(uvm_init);
module_exit(uvm_exit);
