"""train/scoring: the losses and what evaluation reports. Photometric loss and SSIM (losses),
PSNR/SSIM/LPIPS per test image (metrics, lpips), gsplat's colour correction (color_correct), the
distributed evaluation of a model on the test cameras (evaluate). Imports train/model and
train/files only."""
