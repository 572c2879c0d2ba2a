// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for NVIDIA's open kernel module (nvidia.ko) in proxgpu's e2e test host, written for
 * proxgpu. It drives QEMU's bochs-display functions as if they were NVIDIA GPUs, with the parts of
 * NVIDIA's interface that proxgpu depends on, each as NVIDIA/open-gpu-kernel-modules (595.45.04)
 * has it:
 *
 *  - its module name is nvidia, and its modinfo declares NVIDIA's own softdep,
 *    "pre: ecdh_generic,ecdsa_generic" (kernel-open/nvidia/libspdm_ecc.c), so depmod writes it to
 *    modules.softdep as for the real module: the line that shadowed a softdep in any modprobe.d
 *    file named after "modules.softdep";
 *  - char major 195 (NV_MAJOR_DEVICE_NUMBER, kernel-open/common/inc/nv-chardev-numbers.h):
 *    minors 0-247 registered as "nvidia", 255 as "nvidiactl" (nv.c, nvidia_init_module and
 *    nv_register_chrdev), so /proc/devices lists both names;
 *  - each GPU takes the lowest free minor in probe order (nv.c, nv_linux_assign_minor_locked:
 *    find_first_zero_bit over a bitmap of 248) and keeps it until removed;
 *  - /proc/driver/nvidia/gpus/DDDD:BB:SS.F/information with NVIDIA's lines, "Device Minor:" among
 *    them (nv-procfs.c, nv_procfs_read_gpu_info), /proc/driver/nvidia/version and params
 *    (nv_procfs_read_version, nv_procfs_read_params; nvidia-modprobe reads the device files'
 *    owner and mode from params);
 *  - no /dev node is made: user space makes them (nvidia-modprobe);
 *  - removing a GPU whose device file is open waits until it is closed, so an unbind blocks in
 *    the kernel (nv-pci.c, nv_pci_remove: "Attempting to remove device ... with non-zero usage
 *    count!", then os_delay(500) until the count is zero).
 */
#include <linux/atomic.h>
#include <linux/bitmap.h>
#include <linux/cdev.h>
#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/slab.h>

#define NV_MAJOR_DEVICE_NUMBER 195
#define NV_MINOR_DEVICE_NUMBER_REGULAR_MAX 247
#define NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE 255
#define NV_VERSION "595.45.04"

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("stand-in for NVIDIA's nvidia.ko in proxgpu's e2e test host");
MODULE_VERSION(NV_VERSION);
MODULE_SOFTDEP("pre: ecdh_generic,ecdsa_generic");
MODULE_ALIAS_CHARDEV_MAJOR(NV_MAJOR_DEVICE_NUMBER);

struct nv_gpu {
	struct list_head list;
	struct pci_dev *pci;
	unsigned int minor;
	atomic64_t usage_count;
	struct proc_dir_entry *proc;
};

static DECLARE_BITMAP(nv_minors, NV_MINOR_DEVICE_NUMBER_REGULAR_MAX + 1);
static LIST_HEAD(nv_gpus);
static DEFINE_MUTEX(nv_lock);
static struct proc_dir_entry *proc_nvidia, *proc_gpus;
static struct cdev nv_devices_cdev, nv_control_cdev;
static atomic64_t nv_control_usage = ATOMIC64_INIT(0);

/* For nvidia-uvm, as the real one needs the core module loaded first. */
int nv_standin_gpu_count(void)
{
	return bitmap_weight(nv_minors, NV_MINOR_DEVICE_NUMBER_REGULAR_MAX + 1);
}
EXPORT_SYMBOL(nv_standin_gpu_count);

static int nv_information_show(struct seq_file *s, void *v)
{
	struct nv_gpu *gpu = s->private;
	struct pci_dev *pci = gpu->pci;

	seq_printf(s, "Model: \t\t %s\n", "NVIDIA stand-in GPU (proxgpu e2e)");
	seq_printf(s, "IRQ:   \t\t %d\n", pci->irq);
	seq_printf(s, "GPU UUID: \t GPU-%08x-0000-0000-0000-%012x\n", pci_dev_id(pci),
		   pci->bus->number);
	seq_printf(s, "Video BIOS: \t %s\n", "??.??.??.??.??");
	seq_printf(s, "Bus Type: \t %s\n", pci_is_pcie(pci) ? "PCIe" : "PCI");
	seq_printf(s, "DMA Size: \t %d bits\n", 47);
	seq_printf(s, "DMA Mask: \t 0x%llx\n", (unsigned long long)DMA_BIT_MASK(47));
	seq_printf(s, "Bus Location: \t %04x:%02x:%02x.%x\n", pci_domain_nr(pci->bus),
		   pci->bus->number, PCI_SLOT(pci->devfn), PCI_FUNC(pci->devfn));
	seq_printf(s, "Device Minor: \t %u\n", gpu->minor);
	seq_printf(s, "GPU Firmware: \t N/A\n");
	seq_printf(s, "GPU Excluded:\t %s\n", "No");
	return 0;
}

static int nv_version_show(struct seq_file *s, void *v)
{
	seq_printf(s, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  "
		      "Release Build  (proxgpu e2e stand-in)\n", NV_VERSION);
	seq_printf(s, "GCC version:  stand-in\n");
	return 0;
}

static int nv_params_show(struct seq_file *s, void *v)
{
	/* The first lines of the real file, in its order (nv_parms in nv-reg.h). */
	seq_printf(s, "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n"
		      "DeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n");
	return 0;
}

static struct nv_gpu *nv_gpu_of_minor(unsigned int minor)
{
	struct nv_gpu *gpu;

	list_for_each_entry(gpu, &nv_gpus, list)
		if (gpu->minor == minor)
			return gpu;
	return NULL;
}

static int nv_open(struct inode *inode, struct file *file)
{
	unsigned int minor = iminor(inode);
	struct nv_gpu *gpu;

	if (minor == NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE) {
		atomic64_inc(&nv_control_usage);
		return 0;
	}
	mutex_lock(&nv_lock);
	gpu = nv_gpu_of_minor(minor);
	if (gpu)
		atomic64_inc(&gpu->usage_count);
	mutex_unlock(&nv_lock);
	if (!gpu)
		return -ENODEV;
	file->private_data = gpu;
	return 0;
}

static int nv_release(struct inode *inode, struct file *file)
{
	struct nv_gpu *gpu = file->private_data;

	if (gpu)
		atomic64_dec(&gpu->usage_count);
	else
		atomic64_dec(&nv_control_usage);
	return 0;
}

static const struct file_operations nv_fops = {
	.owner = THIS_MODULE,
	.open = nv_open,
	.release = nv_release,
};

static int nv_pci_probe(struct pci_dev *pci, const struct pci_device_id *id)
{
	struct nv_gpu *gpu = kzalloc(sizeof(*gpu), GFP_KERNEL);
	unsigned int minor;

	if (!gpu)
		return -ENOMEM;
	mutex_lock(&nv_lock);
	minor = find_first_zero_bit(nv_minors, NV_MINOR_DEVICE_NUMBER_REGULAR_MAX + 1);
	if (minor > NV_MINOR_DEVICE_NUMBER_REGULAR_MAX) {
		mutex_unlock(&nv_lock);
		kfree(gpu);
		return -ENOSPC;
	}
	set_bit(minor, nv_minors);
	gpu->pci = pci;
	gpu->minor = minor;
	atomic64_set(&gpu->usage_count, 0);
	list_add_tail(&gpu->list, &nv_gpus);
	mutex_unlock(&nv_lock);
	gpu->proc = proc_mkdir(pci_name(pci), proc_gpus);
	if (gpu->proc)
		proc_create_single_data("information", 0444, gpu->proc, nv_information_show, gpu);
	pci_set_drvdata(pci, gpu);
	dev_info(&pci->dev, "NVRM: stand-in GPU, Device Minor %u\n", minor);
	return 0;
}

static void nv_pci_remove(struct pci_dev *pci)
{
	struct nv_gpu *gpu = pci_get_drvdata(pci);

	if (atomic64_read(&gpu->usage_count) != 0) {
		pr_err("NVRM: Attempting to remove device %s with non-zero usage count!\n",
		       pci_name(pci));
		while (atomic64_read(&gpu->usage_count) != 0)
			msleep(500);
	}
	proc_remove(gpu->proc);
	mutex_lock(&nv_lock);
	list_del(&gpu->list);
	clear_bit(gpu->minor, nv_minors);
	mutex_unlock(&nv_lock);
	kfree(gpu);
}

/* QEMU's bochs-display: the e2e test host's stand-in GPUs. */
static const struct pci_device_id nv_pci_table[] = {
	{ PCI_DEVICE(0x1234, 0x1111) },
	{ 0 }
};
MODULE_DEVICE_TABLE(pci, nv_pci_table);

static struct pci_driver nv_pci_driver = {
	.name = "nvidia",
	.id_table = nv_pci_table,
	.probe = nv_pci_probe,
	.remove = nv_pci_remove,
};

static int nv_register_chrdev(unsigned int minor, unsigned int count, struct cdev *cdev,
			      const char *name)
{
	int rc = register_chrdev_region(MKDEV(NV_MAJOR_DEVICE_NUMBER, minor), count, name);

	if (rc < 0)
		return rc;
	cdev_init(cdev, &nv_fops);
	rc = cdev_add(cdev, MKDEV(NV_MAJOR_DEVICE_NUMBER, minor), count);
	if (rc < 0)
		unregister_chrdev_region(MKDEV(NV_MAJOR_DEVICE_NUMBER, minor), count);
	return rc;
}

static void nv_unregister_chrdev(unsigned int minor, unsigned int count, struct cdev *cdev)
{
	cdev_del(cdev);
	unregister_chrdev_region(MKDEV(NV_MAJOR_DEVICE_NUMBER, minor), count);
}

static int __init nv_init(void)
{
	int rc;

	proc_nvidia = proc_mkdir("driver/nvidia", NULL);
	if (!proc_nvidia)
		return -ENOMEM;
	proc_create_single("version", 0444, proc_nvidia, nv_version_show);
	proc_create_single("params", 0444, proc_nvidia, nv_params_show);
	proc_gpus = proc_mkdir("gpus", proc_nvidia);
	rc = pci_register_driver(&nv_pci_driver);
	if (rc < 0)
		goto out_proc;
	rc = nv_register_chrdev(0, NV_MINOR_DEVICE_NUMBER_REGULAR_MAX + 1, &nv_devices_cdev,
				"nvidia");
	if (rc < 0)
		goto out_driver;
	rc = nv_register_chrdev(NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE, 1, &nv_control_cdev,
				"nvidiactl");
	if (rc < 0)
		goto out_devices;
	return 0;
out_devices:
	nv_unregister_chrdev(0, NV_MINOR_DEVICE_NUMBER_REGULAR_MAX + 1, &nv_devices_cdev);
out_driver:
	pci_unregister_driver(&nv_pci_driver);
out_proc:
	proc_remove(proc_nvidia);
	return rc;
}

static void __exit nv_exit(void)
{
	nv_unregister_chrdev(NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE, 1, &nv_control_cdev);
	nv_unregister_chrdev(0, NV_MINOR_DEVICE_NUMBER_REGULAR_MAX + 1, &nv_devices_cdev);
	pci_unregister_driver(&nv_pci_driver);
	proc_remove(proc_nvidia);
}

module_init(nv_init);
module_exit(nv_exit);
